"""One container's life as an engine drives it: ``create`` (with ``--bundle``, ``--pid-file``,
``--log``/``--log-format json`` as containerd's shim passes them), ``start``, wait for the init
process to exit, ``delete``, all through one runtime executable and one private ``--root``.

Like containerd's shim, this process makes itself a child subreaper
(:func:`become_subreaper`), so that the container's init, orphaned when ``create`` returns, is
reparented here and its exit code can be collected. The container's stdio are files in its
bundle.
"""

from __future__ import annotations

import ctypes
import json
import os
import select
import subprocess
import threading
import time
from typing import IO, TYPE_CHECKING

from gpuhook.model.frozen import Frozen

if TYPE_CHECKING:
    from collections.abc import Mapping

PR_SET_CHILD_SUBREAPER = 36
COMMAND_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0


class Ran(Frozen):
    """How a container run went. ``error``: why it did not run to its exit ("" when it did);
    ``created``: whether the runtime holds a container to delete; ``create_s``: the wall time
    of the ``create`` call (where gpuhook-runtime decides and edits the spec, and the runtime
    makes the container and runs its createContainer hooks; the container's own run is not in
    it); ``code``: the init's exit code (None when unknown)."""

    error: str
    created: bool
    create_s: float | None = None
    code: int | None = None
    stdout: str = ""
    stderr: str = ""


def become_subreaper(on: bool = True) -> bool:
    """Make this process the child subreaper of its descendants (or stop being one)."""

    try:
        libc = ctypes.CDLL(None, use_errno=True)
        return int(libc.prctl(PR_SET_CHILD_SUBREAPER, 1 if on else 0, 0, 0, 0)) == 0
    except (OSError, AttributeError):
        return False


def _timed(
    argv: list[str], out: IO[bytes], err: IO[bytes], env: Mapping[str, str], limit: float
) -> tuple[int | None, float]:
    """Run ``argv`` to its exit: (its exit code, or None when it was killed at ``limit``
    seconds; its wall time). A blocking wait, with a timer that kills it at the limit:
    ``subprocess.run(timeout=...)`` polls with growing sleeps, which rounds a 20 ms call up to
    the next of 16, 32, 64 ms."""
    started = time.monotonic()
    proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=err, env=env)
    killed: list[bool] = []

    def kill() -> None:
        killed.append(True)
        proc.kill()

    timer = threading.Timer(limit, kill)
    timer.start()
    try:
        code = proc.wait()
    except BaseException:  # a signal's exception (the run is interrupted): as subprocess.run
        proc.kill()
        proc.wait()
        raise
    finally:
        timer.cancel()
    return (None if killed else code), time.monotonic() - started


def reap_orphans() -> None:
    """Collect the exit of every child that has exited (as a subreaper, this process inherits
    the runtime's orphans: an init left by a create that was killed)."""
    while True:
        try:
            pid, _ = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return


class Runtime:
    """An OCI runtime executable (gpuhook-runtime, or runc for the baseline) with the private
    state folder it is given as ``--root`` and the environment it runs with."""

    def __init__(self, path: str, root: str, env: Mapping[str, str]) -> None:
        self.path = path
        self.root = root
        self.env = dict(env)

    def call(self, *args: str, timeout: float = COMMAND_TIMEOUT_S) -> tuple[int, str]:
        """Run ``<runtime> --root ROOT ARGS``; (exit code, stderr)."""
        try:
            out = subprocess.run(
                [self.path, "--root", self.root, *args],
                capture_output=True,
                text=True,
                env=self.env,
                timeout=timeout,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return 124, f"{self.path} {args[0]} did not return within {timeout:.0f}s"
        except OSError as exc:
            return 127, f"cannot run {self.path}: {exc.strerror}"
        return out.returncode, out.stderr

    def run(self, bundle: str, container_id: str, timeout: float) -> Ran:
        """Create, start and wait for the container (not delete: :meth:`delete` does)."""
        out_path, err_path = os.path.join(bundle, "stdout"), os.path.join(bundle, "stderr")
        log = os.path.join(bundle, "runtime-log.json")
        pid_file = os.path.join(bundle, "init.pid")
        with open(out_path, "wb") as out, open(err_path, "wb") as err:
            create = [self.path, "--root", self.root, "--log", log, "--log-format", "json"]
            create += ["create", "--bundle", bundle, "--pid-file", pid_file, container_id]
            try:
                code, create_s = _timed(create, out, err, self.env, COMMAND_TIMEOUT_S)
            except OSError as exc:
                return Ran(f"cannot run {self.path}: {exc.strerror}", False)
        if code is None:
            return Ran(f"create did not return within {COMMAND_TIMEOUT_S:.0f}s", True)
        if code != 0:
            return Ran(_failure(_read(err_path), log, f"create exited with {code}"), False)
        ran = self._start_and_wait(container_id, pid_file, create_s, timeout)
        return ran.replace(stdout=_read(out_path), stderr=_read(err_path))

    def _start_and_wait(
        self, container_id: str, pid_file: str, create_s: float, limit: float
    ) -> Ran:
        try:
            with open(pid_file) as fh:
                pid = int(fh.read().strip())
        except (OSError, ValueError) as exc:
            return Ran(f"the runtime wrote no usable pid file {pid_file}: {exc}", True)
        code, stderr = self.call("start", container_id)
        if code != 0:
            return Ran(_failure(stderr, "", f"start exited with {code}"), True)
        exited = _wait(pid, limit)
        if exited is False:
            self.call("kill", container_id, "KILL")
            _wait(pid, STOP_TIMEOUT_S)
            return Ran(f"the container did not exit within {limit:.0f}s (killed)", True)
        return Ran("", True, create_s, None if isinstance(exited, bool) else exited)

    def delete(self, container_id: str) -> str:
        """Delete the container as an engine does (``delete``, then ``delete --force`` when a
        plain delete is refused); "" once it is gone, else why not."""
        code, stderr = self.call("delete", container_id)
        if code == 0:
            return ""
        code, stderr = self.call("delete", "--force", container_id)
        if code == 0:
            return ""
        return _failure(stderr, "", f"delete --force exited with {code}")

    def listed(self) -> list[str] | None:
        """The ids the runtime holds under the private root (None when it cannot say)."""
        try:
            out = subprocess.run(
                [self.path, "--root", self.root, "list", "-q"],
                capture_output=True,
                text=True,
                env=self.env,
                timeout=COMMAND_TIMEOUT_S,
                check=False,
                stdin=subprocess.DEVNULL,
            )
        except (OSError, subprocess.TimeoutExpired):
            return None
        return out.stdout.split() if out.returncode == 0 else None


def _wait(pid: int, limit: float) -> int | bool:
    """Wait for the process to exit: its exit code (True when exited but not ours to reap),
    False when it still runs after ``limit`` seconds."""
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True  # gone already, and not a child of this process (no subreaper)
    except OSError:
        return _poll(pid, limit)
    try:
        ready, _, _ = select.select([fd], [], [], limit)
    finally:
        os.close(fd)
    if not ready:
        return False
    try:
        _, status = os.waitpid(pid, 0)
    except ChildProcessError:
        return True
    return os.waitstatus_to_exitcode(status)


def _poll(pid: int, limit: float) -> int | bool:
    """:func:`_wait` without pidfds (kernels before 5.3)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        try:
            done, status = os.waitpid(pid, os.WNOHANG)
        except ChildProcessError:
            try:
                os.kill(pid, 0)
            except ProcessLookupError:
                return True
        else:
            if done:
                return os.waitstatus_to_exitcode(status)
        time.sleep(0.002)
    return False


def _read(path: str) -> str:
    try:
        with open(path, "rb") as fh:
            return fh.read(1 << 20).decode(errors="replace")
    except OSError:
        return ""


def _failure(stderr: str, log: str, fallback: str) -> str:
    """The one line that says why a runtime command failed: gpuhook's line on stderr, else the
    runtime's last error in its JSON log, else its last stderr line, else ``fallback``."""
    lines = [line.strip() for line in stderr.splitlines() if line.strip()]
    ours = [line for line in lines if line.startswith("gpuhook")]
    if ours:
        return ours[-1]
    logged = _last_logged_error(log) if log else ""
    if logged:
        return logged
    if lines:
        return _logrus_message(lines[-1])
    return fallback


def _last_logged_error(log: str) -> str:
    last = ""
    for line in _read(log).splitlines():
        try:
            entry = json.loads(line)
        except ValueError:
            continue
        if isinstance(entry, dict) and entry.get("level") in ("error", "fatal"):
            last = str(entry.get("msg", "")).strip()
    return last


def _logrus_message(line: str) -> str:
    """runc's text log line (``time=... level=error msg="..."``) as its message alone."""
    _, found, rest = line.partition('msg="')
    if not found:
        return line
    return rest.rsplit('"', 1)[0].replace('\\"', '"')
