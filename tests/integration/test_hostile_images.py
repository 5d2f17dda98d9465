"""Hostile images against real runc through gpuhook-runtime (SECURITY.md, classes A and B).

Class A (CVE-2024-0132/0133/0134, CVE-2025-23359, CVE-2025-23267): an image whose paths on the
injection route are symlinks to host paths (absolute, or climbing out with ``../``) or files where
folders are expected. Nothing on the host may be created, changed or mounted; the container
either starts with the injection inside its own rootfs or fails with one line.

Class B (CVE-2025-23266 "NVIDIAScape"): an image whose env points LD_PRELOAD, LD_LIBRARY_PATH,
PATH, GCONV_PATH, PYTHONPATH and PYTHONSTARTUP at files of the image, including through the
hook's cwd (``/proc/self/cwd/...``, relative paths). No host-side process of gpuhook (the shim,
the hook, ldconfig) may load them: a planted library reports every process that loads it.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import testbed

from gpuhook.pipeline import sharing
from tests.conftest import Containers, FakeNode, mps_daemons_under
from tests.hostile import CLIMB, Host, build_planted_library, mounts_under, one_line_failure

pytestmark = [pytest.mark.slow, pytest.mark.root]

# compute and utility (the default capabilities): no /dev/nvidia-modeset
CONTROL = ["/dev/nvidia-uvm", "/dev/nvidia-uvm-tools", "/dev/nvidiactl"]
GPU1 = sorted([*CONTROL, "/dev/nvidia1"])


# (case id, container path, what the image puts there). Kinds: "abs" (absolute symlink to a host
# folder or file), "climb" (the same target behind ../../..), "file" (a regular file where a
# folder is expected), "dir" (a folder where a file is expected).
CASES: list[tuple[str, str, str]] = [
    ("libdir-parent-abs", "/usr/local/gpuhook", "abs"),
    ("libdir-parent-climb", "/usr/local/gpuhook", "climb"),
    ("libdir-parent-file", "/usr/local/gpuhook", "file"),
    ("libdir-abs", "/usr/local/gpuhook/lib", "abs"),
    ("libdir-climb", "/usr/local/gpuhook/lib", "climb"),
    ("libdir-file", "/usr/local/gpuhook/lib", "file"),
    ("dev-abs", "/dev", "abs"),
    ("dev-climb", "/dev", "climb"),
    ("dev-file", "/dev", "file"),
    ("ldcache-abs", "/etc/ld.so.cache", "abs"),
    ("ldcache-climb", "/etc/ld.so.cache", "climb"),
    ("ldcache-dir", "/etc/ld.so.cache", "dir"),
    ("ldconfd-abs", "/etc/ld.so.conf.d", "abs"),
    ("ldconfd-climb", "/etc/ld.so.conf.d", "climb"),
    ("ldconfd-file", "/etc/ld.so.conf.d", "file"),
    ("ldconf-abs", "/etc/ld.so.conf", "abs"),
    ("etc-abs", "/etc", "abs"),
    ("usrbin-abs", "/usr/bin", "abs"),
    ("usrbin-climb", "/usr/bin", "climb"),
    ("usrbin-file", "/usr/bin", "file"),
    ("smi-abs", "/usr/bin/nvidia-smi", "abs"),
    ("smi-climb", "/usr/bin/nvidia-smi", "climb"),
    ("smi-dir", "/usr/bin/nvidia-smi", "dir"),
    ("firmware-abs", "/lib/firmware", "abs"),
    ("firmware-climb", "/lib/firmware/nvidia", "climb"),
    ("socket-dir-abs", "/run/nvidia-persistenced", "abs"),
    ("socket-abs", "/run/nvidia-persistenced/socket", "abs"),
]
FILE_TARGETS = {"/etc/ld.so.cache", "/etc/ld.so.conf", "/usr/bin/nvidia-smi"}
MOUNT_TARGETS = (
    "/usr/local/gpuhook",
    "/dev",
    "/usr/bin",
    "/lib/firmware",
    "/run/nvidia-persistenced",
)
# runc 1.1.5 (Debian 12) itself, with no gpuhook involved, follows an image's /dev symlink when it
# creates /dev/ptmx and the /dev/fd, stdin, stdout, stderr links: CVE-2026-41579 (GHSA-xjvp-4fhw-
# gc47). Those host changes are runc's; the test proves gpuhook adds nothing to them.
RUNC_DEV_LINKS = {"dir", "dir/fd", "dir/stdin", "dir/stdout", "dir/stderr", "dir/ptmx"}


def plant(rootfs: Path, path: str, kind: str, host: Host) -> str:
    """Make ``path`` in the image what ``kind`` says; returns the host path a link aims at."""
    where = rootfs / path.lstrip("/")
    if where.is_symlink() or where.is_file():
        where.unlink()
    elif where.is_dir():
        shutil.rmtree(where)
    where.parent.mkdir(parents=True, exist_ok=True)
    target = str(host.file if path in FILE_TARGETS or path.endswith("/socket") else host.dir)
    if kind == "abs":
        where.symlink_to(target)
    elif kind == "climb":
        where.symlink_to(CLIMB + target.lstrip("/"))
    elif kind == "file":
        where.write_text("a file where a folder is expected\n")
    else:
        where.mkdir()
    return target


def with_env(bundle: Path, *env: str) -> None:
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["env"] += list(env)
    (bundle / "config.json").write_text(json.dumps(spec))


class Attack:
    """One hostile image run twice: under plain runc (what runc alone does to the host) and
    through gpuhook-runtime with a GPU request. Asserts that gpuhook adds nothing on the host:
    the sentinel tree changes exactly as under runc alone, the watched mount table not at all."""

    def __init__(
        self,
        containers: Containers,
        env: dict[str, str],
        tmp_path: Path,
        path: str,
        kind: str,
        args: tuple[str, ...],
        watched: tuple[str | Path, ...],
    ) -> None:
        host, baseline = Host(tmp_path / "host"), Host(tmp_path / "host-runc")
        watched = (tmp_path, *watched, "/usr/local/gpuhook", "/etc/ld.so.cache", "/usr/bin/nvidia")
        mounts_before = mounts_under(*watched)

        plain = containers.bundle(args=("/bin/true",))
        plant(plain / "rootfs", path, kind, baseline)
        before = baseline.snapshot()
        containers.run(plain, env, runtime="runc")
        runc_changes = baseline.changes(before)
        if path == "/dev":
            assert set(runc_changes) <= RUNC_DEV_LINKS
        else:
            assert runc_changes == {}

        self.bundle = containers.bundle(args=args)
        self.rootfs = self.bundle / "rootfs"
        self.target = plant(self.rootfs, path, kind, host)
        with_env(self.bundle, "NVIDIA_VISIBLE_DEVICES=1")
        before = host.snapshot()
        self.out = containers.run(self.bundle, env)
        assert host.changes(before) == runc_changes  # gpuhook adds nothing on the host
        assert mounts_under(*watched) == mounts_before
        assert not os.path.lexists("/usr/local/gpuhook")
        self.started = self.out.returncode == 0
        if not self.started:  # runc refused the layout: one line, no traceback
            line = one_line_failure(self.out.stderr)
            assert line.startswith("time=") and "level=error" in line

    def resolved_inside(self) -> bool:
        """Whether the link's target exists inside the rootfs (where runc resolved it)."""
        return os.path.lexists(self.rootfs / self.target.lstrip("/"))


@pytest.mark.parametrize(("case", "path", "kind"), CASES, ids=[c[0] for c in CASES])
def test_symlinks_and_wrong_types_never_reach_the_host(
    node: FakeNode, containers: Containers, tmp_path: Path, case: str, path: str, kind: str
) -> None:
    attack = Attack(
        containers, node.env, tmp_path, path, kind, ("/bin/sh", "-c", testbed.PROBE), (node.root,)
    )
    if not attack.started:
        return
    out, rootfs = attack.out, attack.rootfs
    seen = testbed.parse_probe(out.stdout)
    assert seen["dev"] == GPU1, out.stderr  # the injection happened, inside the container
    if kind in ("abs", "climb") and path.startswith(MOUNT_TARGETS):
        assert attack.resolved_inside()  # runc resolved the link inside the rootfs
    if path == "/etc/ld.so.cache" and kind != "dir":
        cache = rootfs / "etc/ld.so.cache"
        assert cache.is_file() and not cache.is_symlink()  # ldconfig replaced the link, chrooted
        assert b"/usr/local/gpuhook/lib/libcuda.so.1" in cache.read_bytes()
    if path not in ("/etc", "/etc/ld.so.cache") and not path.startswith(("/usr/bin", "/usr/local")):
        assert seen["smi"][-1] == "rc=0", out.stderr


MPS_CASES = [
    ("pipe-abs", "pipe", "abs"),
    ("pipe-climb", "pipe", "climb"),
    ("pipe-file", "pipe", "file"),
    ("mps-folder-abs", "parent", "abs"),
    ("mps-folder-file", "parent", "file"),
    ("log-abs", "log", "abs"),
    ("log-climb", "log", "climb"),
]


@pytest.mark.parametrize(("case", "which", "kind"), MPS_CASES, ids=[c[0] for c in MPS_CASES])
def test_mps_folders_never_reach_the_host(
    node: FakeNode, containers: Containers, tmp_path: Path, case: str, which: str, kind: str
) -> None:
    """The MPS pipe and log folders gpuhook bind-mounts into an MPS client (a running control
    daemon's host folders) behind the same symlinks and wrong types."""
    pipe, log = sharing.PIPE_IN_CONTAINER, sharing.LOG_IN_CONTAINER
    path = {"pipe": pipe, "log": log, "parent": os.path.dirname(pipe)}[which]
    mps_root = tmp_path / "mps"
    env = node.variant(
        tmp_path,
        mps={"root": str(mps_root), "gpus": [1], "log_dir": True},
        state_dir=str(tmp_path / "state"),
        inventory={"path": str(node.root / "state" / "inventory.json")},
    )
    started = node.gpuhook("mps", "start", env=env)
    assert started.returncode == 0, started.stderr
    try:
        probe = f"ls -1 /dev | grep '^nvidia'; ls -1 {pipe}/; env | grep ^CUDA_MPS_"
        attack = Attack(
            containers, env, tmp_path, path, kind, ("/bin/sh", "-c", probe), (mps_root,)
        )
        if not attack.started:
            return
        out = attack.out.stdout.split()
        assert "nvidia1" in out and "control" in out, attack.out  # the host daemon's pipe
        assert f"CUDA_MPS_PIPE_DIRECTORY={pipe}" in out
        if kind in ("abs", "climb"):
            assert attack.resolved_inside()
    finally:
        node.gpuhook("mps", "stop", env=env)
        for pid in mps_daemons_under(mps_root):  # only the daemons this test started
            os.kill(pid, signal.SIGKILL)


# --- class B: the image's env never reaches a host-side process --------------------------------

PLANTED = "/planted"


def plant_env_attack(rootfs: Path, host: Host) -> list[str]:
    """Plant a library, scripts and Python files in the image; return the env that aims every
    loader and interpreter search path at them, also through the hook's cwd (the rootfs)."""
    lib = build_planted_library(rootfs / "planted" / "libplanted.so", host.markers)
    (rootfs / host.markers.relative_to("/")).mkdir(parents=True)  # the in-container control
    for soname in (
        "libz.so.1",
        "libexpat.so.1",
        "libffi.so.8",
        "libpython3.11.so.1.0",
    ):
        shutil.copy(lib, rootfs / "planted" / soname)
    gconv = rootfs / "planted" / "gconv"
    gconv.mkdir()
    shutil.copy(lib, gconv / "PLANTED.so")
    (gconv / "gconv-modules").write_text("module PLANTED// INTERNAL PLANTED 1\n")
    scripts = rootfs / "planted" / "bin"
    scripts.mkdir()
    for name in ("ldconfig", "sh", "python3", "gpuhook", "runc", "env"):
        (scripts / name).write_text(f"#!/bin/sh\necho {name} > {host.markers}/script-{name}\n")
        (scripts / name).chmod(0o755)
    py = f"open({str(host.markers)!r} + '/python-' + __name__, 'w').write(__file__)\n"
    for folder in (rootfs / "planted" / "py", rootfs):  # PYTHONPATH, and the hook's cwd
        (folder / "gpuhook").mkdir(parents=True)
        for name in ("sitecustomize.py", "usercustomize.py", "startup.py", "gpuhook/__init__.py"):
            (folder / name).write_text(py)
    cwd = "/proc/self/cwd" + PLANTED
    return [
        f"LD_PRELOAD={cwd}/libplanted.so planted/libplanted.so {PLANTED}/libplanted.so",
        f"LD_AUDIT={cwd}/libplanted.so",
        f"LD_LIBRARY_PATH={cwd}:planted:{PLANTED}",
        f"PATH={cwd}/bin:planted/bin:{PLANTED}/bin:/usr/sbin:/usr/bin:/sbin:/bin",
        f"GCONV_PATH={cwd}/gconv",
        f"PYTHONPATH={cwd}/py:planted/py:.",
        f"PYTHONSTARTUP={cwd}/py/startup.py",
        f"PYTHONHOME={cwd}/py",
        "PYTHONINSPECT=1",
    ]


def test_planted_library_detects_a_host_side_load(tmp_path: Path, rootfs_template: str) -> None:
    """The detector works: a host process started with the planted env and the rootfs as cwd
    (what an OCI hook without an explicit env gets) leaves a marker naming itself."""
    host = Host(tmp_path / "host")
    rootfs = tmp_path / "rootfs"
    shutil.copytree(rootfs_template, rootfs, symlinks=True)
    env = dict(e.split("=", 1) for e in plant_env_attack(rootfs, host))
    subprocess.run(["/bin/true"], env=env, cwd=rootfs, check=True)
    assert host.loads() and all(line.endswith("/usr/bin/true") for line in host.loads())


def test_image_env_never_reaches_gpuhook_on_the_host(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    host = Host(tmp_path / "host")
    probe = (
        "/bin/ls -1 /dev | /bin/grep ^nvidia; echo '--- smi'; /usr/bin/nvidia-smi -L; echo rc=$?"
    )
    bundle = containers.bundle(args=("/bin/sh", "-c", probe))
    env = plant_env_attack(bundle / "rootfs", host)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["env"] = [*env, "NVIDIA_VISIBLE_DEVICES=1"]
    (bundle / "config.json").write_text(json.dumps(spec))

    out = containers.run(bundle, node.env)
    assert out.returncode == 0, out.stderr
    seen = testbed.parse_probe(out.stdout)
    assert seen["dev"] == GPU1  # the GPU create ran: shim, hook and ldconfig all ran
    assert seen["smi"][-1] == "rc=0"
    cache = (bundle / "rootfs/etc/ld.so.cache").read_bytes()
    assert b"/usr/local/gpuhook/lib/libcuda.so.1" in cache  # the hook's ldconfig did its work
    assert host.loads() == []  # nothing on the host loaded anything of the image
    inside = bundle / "rootfs" / host.markers.relative_to("/")
    assert any(p.read_text().split()[1] == "/usr/bin/nvidia-smi" for p in inside.iterdir())
    spec = json.loads((bundle / "config.json").read_text())
    hooks = [h for stage in spec.get("hooks", {}).values() for h in stage]
    assert hooks  # gpuhook added its createContainer hook ...
    for hook in hooks:  # ... and every hook carries its own env, none of the image's: a fixed
        # PATH and the host-side config file and cache gpuhook-runtime itself was started with
        assert hook["env"] == [
            "PATH=/usr/sbin:/usr/bin:/sbin:/bin",
            f"GPUHOOK_CONFIG={node.env['GPUHOOK_CONFIG']}",
            f"GPUHOOK_CACHE_DIR={node.env['GPUHOOK_CACHE_DIR']}",
        ], hook


def test_a_hook_without_env_would_have_been_exploitable(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """Why the explicit env matters (CVE-2025-23266): under this runc, a createContainer hook
    without "env" runs on the host with the image's env and the rootfs as cwd. Such a hook (not
    gpuhook's) loads the planted library on the host; gpuhook's own hook, in the same spec, not."""
    host = Host(tmp_path / "host")
    bundle = containers.bundle(args=("/bin/true",))
    env = plant_env_attack(bundle / "rootfs", host)
    spec = json.loads((bundle / "config.json").read_text())
    spec["process"]["env"] = env
    spec["hooks"] = {"createContainer": [{"path": "/bin/sh", "args": ["sh", "-c", "pwd"]}]}
    (bundle / "config.json").write_text(json.dumps(spec))
    out = containers.run(bundle, node.env)
    assert out.returncode == 0, out.stderr
    assert host.loads() and all(line.endswith("/dash") for line in host.loads())


# --- the ldconfig the hook runs is bounded: the image's ld.so.conf is hostile input --------------


def _hook(
    program: str, rootfs: Path, bundle: Path, *args: str
) -> tuple[subprocess.CompletedProcess[str], float]:
    (bundle / "config.json").write_text(json.dumps({"root": {"path": str(rootfs)}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "c", "pid": 1, "bundle": str(bundle)})
    start = time.monotonic()
    wrapper = (
        "import resource, subprocess, sys\n"
        "resource.setrlimit(resource.RLIMIT_AS, (3 << 30, 3 << 30))  # a safety net\n"
        "out = subprocess.run(sys.argv[1:], input=sys.stdin.buffer.read(), capture_output=True)\n"
        "sys.stderr.buffer.write(out.stderr)\n"
        "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)\n"
        "sys.exit(out.returncode)\n"
    )
    config = bundle / "gpuhook.yaml"  # the hook logs: keep it off the host's /var/log/gpuhook
    config.write_text(f"state_dir: {bundle}/state\nlog:\n  file: {bundle}/gpuhook.log\n")
    out = subprocess.run(
        [sys.executable, "-c", wrapper, program, "hook", "update-ldcache", *args],
        input=state,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "GPUHOOK_CONFIG": str(config)},
    )
    return out, time.monotonic() - start


# The static dispatcher with the form gpuhook-runtime writes, and the Python form (CDI specs).
HOOK_FORMS = pytest.mark.parametrize("form", ["gpuhook-runtime", "gpuhook"])


def _form(form: str, rootfs: Path) -> tuple[str, list[str]]:
    if form == "gpuhook-runtime":
        return testbed.RUNTIME, ["--ldconfig", "/sbin/ldconfig", "--rootfs", str(rootfs)]
    return testbed.GPUHOOK, []


@HOOK_FORMS
@pytest.mark.parametrize("attack", ["dev-zero", "fifo"])
@pytest.mark.parametrize("cache", ["merged", "full-run"])
def test_hostile_ld_so_conf_cannot_exhaust_or_block_the_hook(
    tmp_path: Path, rootfs_template: str, attack: str, cache: str, form: str
) -> None:
    """/etc/ld.so.conf as a link to /dev/zero (one endless line: ldconfig's memory grew without
    bound) or as a FIFO (ldconfig blocked forever). Merging into the image's cache reads no
    ld.so.conf at all; where the full run is needed (here: the image's cache is a link, never
    read) the hook stays bounded, warns in one line and exits 0, so the container starts with
    the image's own cache."""
    rootfs = tmp_path / "rootfs"
    shutil.copytree(rootfs_template, rootfs, symlinks=True)
    conf = rootfs / "etc/ld.so.conf"
    conf.unlink()
    if attack == "fifo":
        os.mkfifo(conf)
    else:
        os.mknod(rootfs / "dev/zero", 0o666 | 0o020000, os.makedev(1, 5))
        conf.symlink_to("/dev/zero")
    if cache == "full-run":
        (rootfs / "etc/ld.so.cache").unlink()
        (rootfs / "etc/ld.so.cache").symlink_to("/etc/ld.so.cache")
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    program, args = _form(form, rootfs)
    out, took = _hook(program, rootfs, bundle, *args, "--timeout", "2", "--folder", "/usr/lib")
    assert out.returncode == 0, out.stderr
    max_rss_kib = int(out.stdout.strip())
    assert max_rss_kib < 400 << 10  # ldconfig's heap is capped at 256 MiB
    if cache == "merged":
        assert (out.stderr, took < 10) == ("", True)
        assert (rootfs / "etc/ld.so.cache").is_file()  # the image's cache, merged into
        return
    if attack == "fifo":
        assert 2 <= took < 10
        assert out.stderr == (
            "gpuhook hook update-ldcache: /sbin/ldconfig ran past 2s; "
            "the container's ld.so.cache was not refreshed\n"
        )
    else:
        assert took < 10 and "Traceback" not in out.stderr
