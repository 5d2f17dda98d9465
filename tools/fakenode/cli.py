"""The command line of tools/fake-node: its arguments and their checks, the folder it builds in
(refused unless empty or a fake node it made, with --force), and the build's order."""

from __future__ import annotations

import argparse
import json
import os
import re
import shlex
import shutil
import subprocess
import sys

from fakenode import GENERATOR, REPO, Fail
from fakenode.build import build
from fakenode.config import write_config
from fakenode.devices import CAP_MAX_GPUS, MAX_GPUS, MAX_MIG_DEVICES
from fakenode.driver import LAYOUTS
from fakenode.model import build_model
from fakenode.nvmldata import nvml_data
from fakenode.tree import make_tree, run_ldconfig, write

DESCRIPTION = (
    "Build a fake NVIDIA GPU node in a folder, out of real mechanisms, for gpuhook's tests."
)
MARKER = ".fake-node"  # written first, so a half-built node can be rebuilt with --force


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog="fake-node", description=DESCRIPTION)
    p.add_argument("dir")
    p.add_argument("--gpus", type=int, default=8)
    p.add_argument("--mig-gpus", default="", help="comma list of MIG-enabled GPU indices")
    p.add_argument("--mig-devices", type=int, default=3, help="MIG devices per MIG GPU (1..7)")
    p.add_argument("--driver-version", default="550.54.15")
    p.add_argument("--cuda-version", type=int, default=12040)
    p.add_argument("--gpu-name", default="NVIDIA H100 80GB HBM3")
    p.add_argument("--memory", type=int, default=85520809984, help="bytes per GPU")
    p.add_argument("--compute-capability", default="9.0")
    p.add_argument(
        "--gpu-brand", type=int, default=14, help="NVML brand type (14: NVIDIA data center)"
    )
    p.add_argument(
        "--layout",
        choices=sorted(LAYOUTS),
        default="standard",
        help="where the driver keeps its files (gke: lib64, bin, share; no ld.so.cache)",
    )
    p.add_argument("--no-nvml", action="store_true", help="do not install libnvidia-ml")
    p.add_argument("--no-ldcache", action="store_true", help="do not create etc/ld.so.cache")
    p.add_argument("--runtime", help="runc path for the config (default: runc on PATH)")
    p.add_argument("--hook-path", default=os.path.join(REPO, ".venv", "bin", "gpuhook"))
    p.add_argument("--force", action="store_true", help="replace DIR's contents")
    args = p.parse_args(argv)

    if not 0 <= args.gpus <= MAX_GPUS:
        raise Fail(f"--gpus must be 0..{MAX_GPUS}")
    try:
        args.mig_gpus = {int(x) for x in args.mig_gpus.split(",") if x.strip()}
    except ValueError:
        raise Fail(f"--mig-gpus: not a comma list of indices: {args.mig_gpus!r}") from None
    for index in args.mig_gpus:
        if not 0 <= index < min(args.gpus, CAP_MAX_GPUS):
            raise Fail(f"--mig-gpus: no GPU {index} (or beyond the driver's {CAP_MAX_GPUS})")
    if not 1 <= args.mig_devices <= MAX_MIG_DEVICES:
        raise Fail(f"--mig-devices must be 1..{MAX_MIG_DEVICES}")
    if not re.fullmatch(r"\d+\.\d+(\.\d+)?", args.driver_version):
        raise Fail(f"--driver-version: not a driver version: {args.driver_version!r}")
    if args.cuda_version <= 0 or args.memory <= 0:
        raise Fail("--cuda-version and --memory must be positive")
    if not 0 <= args.gpu_brand <= 64:
        raise Fail("--gpu-brand must be an NVML brand type (0..64)")
    if args.layout == "gke":
        args.no_ldcache = True  # a GKE driver root has no ld.so.cache
    if not re.fullmatch(r"\d+\.\d+", args.compute_capability):
        raise Fail("--compute-capability must look like 9.0")
    if not args.gpu_name.strip() or not args.gpu_name.isprintable() or len(args.gpu_name) > 80:
        raise Fail("--gpu-name must be printable, 1..80 characters")
    if args.runtime is None:
        args.runtime = shutil.which("runc")
        if not args.runtime:
            raise Fail("runc not found on PATH; pass --runtime PATH")
    args.runtime = os.path.abspath(args.runtime)
    args.hook_path = os.path.abspath(args.hook_path)
    return args


def prepare_dir(root: str, force: bool) -> None:
    if os.path.lexists(root) and not os.path.isdir(root):
        raise Fail(f"{root} exists and is not a folder")
    os.makedirs(root, exist_ok=True)
    entries = os.listdir(root)
    if not entries:
        return
    ours = os.path.isfile(os.path.join(root, MARKER))
    if not ours:
        raise Fail(f"{root} is not empty and holds no fake node; refusing to touch it")
    if not force:
        raise Fail(f"{root} already holds a fake node; pass --force to rebuild it")
    for name in entries:
        path = os.path.join(root, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)


def main(argv: list[str]) -> int:
    try:
        args = parse_args(argv)
        if os.geteuid() != 0:
            raise Fail("must run as root (device nodes are made with mknod)")
        gcc = shutil.which("gcc")
        if not gcc:
            raise Fail("gcc not found on PATH (apt install gcc)")
        root = os.path.abspath(args.dir)
        prepare_dir(root, args.force)
        write(os.path.join(root, MARKER), GENERATOR + "\n")
        os.umask(0o022)
        node = build_model(args, root)
        make_tree(node)
        write(node["nvml_data"], nvml_data(node, node["dev_root"]))
        build(node, gcc)
        if not args.no_ldcache:
            run_ldconfig(node["driver_root"])
        write_config(node)
        write(os.path.join(root, "node.json"), json.dumps(node, indent=2) + "\n")
    except Fail as exc:
        print(f"fake-node: {exc}", file=sys.stderr)
        return 1
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"fake-node: {exc}", file=sys.stderr)
        return 1
    n_migs = sum(len(g["mig_devices"]) for g in node["gpus"])
    print(
        f"fake-node: {len(node['gpus'])} GPUs, {n_migs} MIG devices, driver "
        f"{node['driver_version']} in {root}",
        file=sys.stderr,
    )
    for key, value in node["env"].items():
        print(f"export {key}={shlex.quote(value)}")
    return 0
