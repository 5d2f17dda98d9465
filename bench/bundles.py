"""The runtimes and bundles of a run, and the timed runtime calls of one container's
lifecycle (create, start, reap, delete), as an engine's shim makes them."""

from __future__ import annotations

import os
import subprocess
import time

PR_SET_CHILD_SUBREAPER = 36


class BenchError(Exception):
    """A runtime call failed or a spec came out wrong: the bench stops with one line."""


class Runtime:
    def __init__(self, name: str, path: str, env: dict[str, str]) -> None:
        self.name = name
        self.path = path
        self.env = env


class Bundle:
    """A bundle whose config.json is restored from ``original`` before each use."""

    def __init__(self, path: str, original: bytes, runtime: Runtime, state: str) -> None:
        self.path = path
        self.original = original
        self.ldcache = os.path.join(path, "rootfs", "etc", "ld.so.cache")
        with open(self.ldcache, "rb") as fh:
            self.image_ldcache = fh.read()  # the image's own, as each container starts with it
        self.runtime = runtime
        self.state = state
        self.config = os.path.join(path, "config.json")
        self.stderr = os.path.join(path, "runtime.stderr")
        self.pid_file = os.path.join(path, "init.pid")
        self.log = os.path.join(path, "runtime-log.json")

    def reset(self) -> None:
        with open(self.config, "wb") as fh:
            fh.write(self.original)
        with open(self.ldcache, "wb") as fh:
            fh.write(self.image_ldcache)
        for name in ("init.pid", "gpuhook-decision.json", "runtime-log.json"):
            try:
                os.unlink(os.path.join(self.path, name))
            except FileNotFoundError:
                pass

    def argv(self, *args: str) -> list[str]:
        rt = self.runtime.path
        return [rt, "--root", self.state, "--log", self.log, "--log-format", "json", *args]


def call(bundle: Bundle, argv: list[str], what: str) -> tuple[float, float]:
    """Run one runtime call as a shim does (stdin and stdout /dev/null, cwd the bundle); return
    its wall time and CPU time (user+sys of it and the children it waited for) in ms. Raises
    BenchError when it fails. posix_spawn + wait4: the least harness work around the call."""
    os.chdir(bundle.path)
    actions = [
        (os.POSIX_SPAWN_OPEN, 0, "/dev/null", os.O_RDONLY, 0),
        (os.POSIX_SPAWN_OPEN, 1, "/dev/null", os.O_WRONLY, 0),
        (os.POSIX_SPAWN_OPEN, 2, bundle.stderr, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644),
    ]
    t0 = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, bundle.runtime.env, file_actions=actions)
    _, status, usage = os.wait4(pid, 0)
    elapsed = (time.perf_counter() - t0) * 1000.0
    code = os.waitstatus_to_exitcode(status)
    if code != 0:
        with open(bundle.stderr, "rb") as fh:
            detail = fh.read().decode(errors="replace").strip().splitlines()
        raise BenchError(
            f"{bundle.runtime.name} {what} failed with {code} in {bundle.path}: "
            f"{detail[-1] if detail else '(no stderr)'}"
        )
    return elapsed, (usage.ru_utime + usage.ru_stime) * 1000.0


def interpreter_start() -> float:
    """Wall ms of ``python3 -I -S -c pass`` (the interpreter gpuhook-runtime starts)."""
    argv = ["/usr/bin/python3", "-I", "-S", "-c", "pass"]
    t0 = time.perf_counter()
    pid = os.posix_spawn(argv[0], argv, {})
    os.waitpid(pid, 0)
    return (time.perf_counter() - t0) * 1000.0


def reap(pid: int, timeout_s: float = 10.0) -> float:
    """Wait for the container's init (reparented to this subreaper) to exit; return its CPU
    time in ms (runc init's own work in the container, and the hooks it ran and waited for)."""
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            done, _, usage = os.wait4(pid, os.WNOHANG)
        except ChildProcessError:
            return 0.0  # not our child (no subreaper): runc delete copes with a stopped container
        if done:
            return (usage.ru_utime + usage.ru_stime) * 1000.0
        if time.monotonic() > deadline:
            raise BenchError(f"container init {pid} did not exit within {timeout_s:.0f}s")
        time.sleep(0.0005)


def lifecycle(bundle: Bundle, container_id: str) -> tuple[float, float, float, float]:
    """create -> start -> (reap) -> delete; returns the three call times and the CPU time of
    the whole lifecycle (the calls, the container's init and its hooks), in ms."""
    bundle.reset()
    create, cpu_create = call(
        bundle,
        bundle.argv("create", "--bundle", bundle.path, "--pid-file", bundle.pid_file, container_id),
        "create",
    )
    with open(bundle.pid_file) as fh:
        pid = int(fh.read().strip())
    start, cpu_start = call(bundle, bundle.argv("start", container_id), "start")
    cpu_init = reap(pid)
    delete, cpu_delete = call(bundle, bundle.argv("delete", container_id), "delete")
    return create, start, delete, cpu_create + cpu_start + cpu_init + cpu_delete


def take_edited_spec(src: Bundle, dest: Bundle, container_id: str) -> None:
    """Give ``dest`` (a plain runc bundle) the spec that ``src``'s gpuhook-runtime writes on
    create (one create, the spec read back, the container deleted), ``src``'s path swapped for
    ``dest``'s: runc's own share of a GPU container's start is then measured on ``dest``. Raises
    BenchError when that spec does not name its bundle or lacks the ldcache hook."""
    src.reset()
    argv = src.argv("create", "--bundle", src.path, "--pid-file", src.pid_file, container_id)
    call(src, argv, "create")
    with open(src.config, "rb") as fh:
        spec = fh.read()
    force_delete(src.runtime, src.state, container_id)
    dest.original = spec.replace(src.path.encode(), dest.path.encode())
    if dest.original == spec or b"update-ldcache" not in spec:
        raise BenchError("gpuhook's 1-GPU spec does not name its bundle or lacks its hook")


def force_delete(runtime: Runtime, state: str, container_id: str) -> None:
    subprocess.run(
        [runtime.path, "--root", state, "delete", "--force", container_id],
        env=runtime.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        check=False,
    )
