"""The runtime service in tests: start ``gpuhook runtime serve``, and talk to it as
gpuhook-runtime's dispatcher does.

* :class:`RuntimeService` runs ``gpuhook runtime serve --socket PATH`` (the executable under test,
  ``testbed.GPUHOOK``) with a test config and stops it with SIGTERM; tests get one from the
  ``runtime_service`` fixture of tests/conftest.py.
* :func:`request` is the dispatcher's side of the protocol, in this process: one request with
  the given stdio descriptors and working folder, the reply decoded.
* Run as a script, this file *is* a dispatcher for the service (a stand-in for the compiled
  one): ``python3 tests/runtime_service.py --socket S [--reply-file F] -- ARGV0 ARGS...`` sends
  its own argv, environment, stdio and working folder, then execs the runtime the service names
  with ARGS, or exits with the service's code. A decline exits 75 with the reason on stderr (the
  real dispatcher would start Python); no service exits 69. :func:`dispatcher_script` writes an
  executable that runs it, usable wherever a test runs gpuhook-runtime.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
sys.path.insert(0, str(REPO / "tools"))

import testbed  # noqa: E402

from gpuhook.runtime import wire  # noqa: E402

DECLINED_EXIT = 75
NO_SERVICE_EXIT = 69


class Reply:
    """What the service answered: ``kind`` is ``wire.EXEC``/``EXIT``/``DECLINE``, or b""
    when it closed the connection without a reply."""

    def __init__(self, data: bytes) -> None:
        self.raw = data
        self.kind, self.payload = wire.decode_reply(data) if data else (b"", b"")

    @property
    def text(self) -> str:
        return self.payload.decode("utf-8", "replace")

    def __repr__(self) -> str:
        return f"Reply({self.raw!r})"


def request(
    socket_path: str | Path,
    argv: Sequence[str],
    env: Mapping[str, str],
    *,
    cwd: str | Path = "/",
    stdio: Sequence[int] | None = None,
    timeout: float = 60,
) -> Reply:
    """Send one request (argv[0] included) with ``stdio`` (default: /dev/null three times) and
    ``cwd`` opened ``O_PATH | O_DIRECTORY``; return the reply."""
    own: list[int] = []
    if stdio is None:
        null = os.open(os.devnull, os.O_RDWR)
        own.append(null)
        stdio = (null, null, null)
    folder = os.open(cwd, os.O_PATH | os.O_DIRECTORY)
    own.append(folder)
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET) as sock:
            sock.settimeout(timeout)
            sock.connect(str(socket_path))
            message = wire.encode_request(list(argv), [f"{k}={v}" for k, v in env.items()])
            socket.send_fds(sock, [message], [*stdio, folder])
            return Reply(sock.recv(wire.MAX_REPLY))
    finally:
        for fd in own:
            os.close(fd)


class RuntimeService:
    """``gpuhook runtime serve --socket PATH`` with ``env`` (GPUHOOK_CONFIG: the test config)."""

    def __init__(
        self, socket_path: Path, env: Mapping[str, str], output: Path, socket_option: bool = True
    ) -> None:
        """Start it; its stdout and stderr go to ``output`` + ``.out`` / ``.err``. Without
        ``socket_option`` it gets no ``--socket`` (``socket_path`` is then the config's)."""
        self.socket = socket_path
        self.env = {**os.environ, **env}
        self.stdout = output.with_name(output.name + ".out")
        self.stderr = output.with_name(output.name + ".err")
        with open(self.stdout, "wb") as out, open(self.stderr, "wb") as err:
            self.process = subprocess.Popen(
                [testbed.GPUHOOK, "runtime", "serve"]
                + (["--socket", str(socket_path)] if socket_option else []),
                env=self.env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
            )

    def wait_listening(self, timeout: float = 60) -> str:
        """The line it prints once it accepts; fails with its stderr if it exits first."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            text = self.stdout.read_text()
            if text.endswith("\n"):
                return text
            if self.process.poll() is not None:
                raise AssertionError(
                    f"runtime service exited {self.process.returncode}: {self.stderr.read_text()}"
                )
            time.sleep(0.05)
        raise AssertionError(f"runtime service not listening after {timeout} s")

    def request(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        *,
        cwd: str | Path = "/",
        stdio: Sequence[int] | None = None,
    ) -> Reply:
        """:func:`request` to this service, with the service's env by default."""
        return request(self.socket, argv, self.env if env is None else env, cwd=cwd, stdio=stdio)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
        """Signal it and wait; its exit code."""
        if self.process.poll() is None:
            self.process.send_signal(sig)
        try:
            return self.process.wait(timeout)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
            raise


def dispatcher_script(path: Path, socket_path: Path, reply_file: Path | None = None) -> Path:
    """An executable at ``path`` that runs this file as a dispatcher for ``socket_path``."""
    reply = f" --reply-file '{reply_file}'" if reply_file else ""
    path.write_text(
        "#!/bin/sh\n"
        f"exec '{sys.executable}' '{Path(__file__).resolve()}' --socket '{socket_path}'{reply}"
        ' -- "$0" "$@"\n'
    )
    path.chmod(0o755)
    return path


def _main(args: list[str]) -> int:
    """The dispatcher: see the module docstring."""
    split = args.index("--")
    options, argv = args[:split], args[split + 1 :]
    socket_path = options[options.index("--socket") + 1]
    reply_file = options[options.index("--reply-file") + 1] if "--reply-file" in options else ""
    try:
        reply = request(socket_path, argv, dict(os.environ), cwd=".", stdio=(0, 1, 2))
    except OSError as exc:
        sys.stderr.write(f"no runtime service at {socket_path}: {exc}\n")
        return NO_SERVICE_EXIT
    if reply_file:
        Path(reply_file).write_bytes(reply.raw)
    if reply.kind == wire.EXEC:
        os.execv(reply.payload, [reply.payload, *map(os.fsencode, argv[1:])])
    if reply.kind == wire.EXIT:
        return int(reply.payload)
    if reply.kind == wire.DECLINE:
        sys.stderr.write(f"declined: {reply.text}\n")
        return DECLINED_EXIT
    sys.stderr.write("gpuhook: the runtime service closed the connection without a reply\n")
    return 1


if __name__ == "__main__":
    sys.exit(_main(sys.argv[1:]))
