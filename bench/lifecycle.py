#!/usr/bin/python3
"""Container-start overhead of gpuhook-runtime over plain runc, measured in one interleaved run.

    make bench                      # or: bench/lifecycle.py [-n 100] [--peer PATH] ...

Each case is a real OCI bundle (a busybox rootfs running /bin/true, the spec ``runc spec``
writes) on tmpfs, driven through the lifecycle an engine's shim drives: ``create`` (with
``--log``, ``--log-format json`` and ``--pid-file``), ``start``, reap the container's init (this
process is a child subreaper, as containerd-shim is), ``delete``. The three runtime calls are
timed; the container's own run time is not. Every runtime (plain runc, the gpuhook-runtime
dispatcher an operator installs, any ``--peer``) runs every case in every iteration, in a
shuffled order, so drift on a busy machine hits them alike. The bundle's config.json is restored
before each lifecycle (an engine writes a fresh one per container).

Cases: a non-GPU container; the default-"all" leak case (image env NVIDIA_VISIBLE_DEVICES=all,
Kubernetes CRI annotations, a kubelet checkpoint that allocates nothing to it); 1 GPU; 1 GPU in a
big image (3,000 ELF libraries across 12 ld.so.conf.d folders, and its own ld.so.cache, as CUDA
and PyTorch images carry them); 8 GPUs; one MIG device on a node with 8 GPUs and 56 MIG devices;
one passthrough call (``list``); and N concurrent creates of 1-GPU containers (every create must
succeed and every spec must be whole). Each lifecycle starts from the image's own ld.so.cache (an
engine's fresh snapshot), restored with the spec.

Output: a table (min/median/p95 per case and runtime, overhead over runc in ms and as a ratio),
the targets of issue 8 with their verdicts, and the same as JSON (``--json``, default
build/bench/latest.json). Needs root, runc, busybox-static and gcc (tools/fake-node).
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import shutil
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tools"))

import testbed  # noqa: E402
from bundles import PR_SET_CHILD_SUBREAPER, BenchError  # noqa: E402
from cases import GPUHOOK_PYTHON  # noqa: E402
from report import build_report, markdown, print_report  # noqa: E402
from runner import Bench  # noqa: E402


def parse_args(argv: list[str]) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "-n",
        "--iterations",
        type=int,
        default=100,
        help="measured lifecycles per case and runtime (interleaved; >= 40 for a report)",
    )
    p.add_argument("--warmup", type=int, default=3, help="unmeasured lifecycles first")
    p.add_argument(
        "--concurrency", default="32,64", help="widths of the concurrent-create case ('' for none)"
    )
    p.add_argument(
        "--rounds", type=int, default=5, help="rounds of each concurrent width per runtime"
    )
    p.add_argument("--runtime", default=testbed.RUNTIME, help="gpuhook-runtime to measure")
    p.add_argument(
        "--hook", default=testbed.GPUHOOK, help="the gpuhook executable (hooks, inventory)"
    )
    p.add_argument("--runc", default=shutil.which("runc") or "/usr/sbin/runc")
    p.add_argument(
        "--no-service",
        action="store_true",
        help="start no runtime service: gpuhook's GPU creates start Python",
    )
    p.add_argument(
        "--compare-python",
        action="store_true",
        help=f"also run the dispatcher with a config naming no service ({GPUHOOK_PYTHON})",
    )
    p.add_argument(
        "--peer",
        action="append",
        default=[],
        help="another runc-compatible runtime: PATH or NAME=PATH",
    )
    p.add_argument(
        "--peer-env", action="append", default=[], help="KEY=VALUE in the peers' environment"
    )
    p.add_argument(
        "--peer-cdi-hook",
        metavar="PATH",
        help="NVIDIA's nvidia-cdi-hook: write, for each fake node, the CDI spec nvidia-ctk cdi "
        "generate would write (hooks included) and a config.toml for nvidia-container-runtime "
        "in CDI mode, and give the peers XDG_CONFIG_HOME pointing at it",
    )
    p.add_argument(
        "--nodes",
        metavar="DIR",
        help="build the fake nodes in DIR/a and DIR/b and keep them (same paths and UUIDs on "
        "every run, e.g. for a peer runtime's CDI spec)",
    )
    p.add_argument("--json", default=os.path.join(REPO, "build", "bench", "latest.json"))
    p.add_argument("--markdown", metavar="PATH", help="also write the table as Markdown")
    p.add_argument("--seed", type=int, default=8)
    p.add_argument("--keep", action="store_true", help="keep the bundles and fake nodes")
    p.add_argument("--quiet", action="store_true")
    return p.parse_args(argv)


def main(argv: list[str]) -> int:
    opts = parse_args(argv)
    # the runs chdir into bundles: output paths are taken against the caller's folder now
    opts.json = os.path.abspath(opts.json) if opts.json else opts.json
    opts.markdown = os.path.abspath(opts.markdown) if opts.markdown else opts.markdown
    if os.geteuid() != 0:
        sys.stderr.write("bench: needs root (runc, mknod)\n")
        return 2
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) != 0:
        sys.stderr.write("bench: cannot become a child subreaper\n")
        return 2
    bench = Bench(opts)
    t0 = time.monotonic()
    try:
        bench.setup()
        bench.log(f"setup done in {time.monotonic() - t0:.0f}s; {opts.iterations} iterations")
        samples = bench.run_single(opts.iterations, opts.warmup)
        concurrent = bench.run_concurrent(opts.rounds)
        bench.check_service()  # still there at the end, before cleanup stops it
        report = build_report(bench, samples, concurrent, time.monotonic() - t0)
    except BenchError as exc:
        sys.stderr.write(f"bench: {exc}\n")
        return 1
    finally:
        bench.cleanup()
    print_report(report)
    if opts.json:
        os.makedirs(os.path.dirname(os.path.abspath(opts.json)), exist_ok=True)
        with open(opts.json, "w") as fh:
            json.dump(report, fh, indent=2)
            fh.write("\n")
        sys.stdout.write(f"\nJSON: {opts.json}\n")
    if opts.markdown:
        with open(opts.markdown, "w") as fh:
            fh.write(markdown(report))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
