"""The installed dispatcher and the Python shim take the same path for every argv and spec.

The dispatcher is built from packaging/gpuhook-runtime.c.in by the build step
(gpuhook.runtime.dispatch: rendered, compiled, relocated) with a stand-in for Python that only
says it was started, and a runtime pointer naming a recorder. argvs come from runc's own
documented grammar (tests/runc_grammar.py), plus argvs with flags no grammar knows. A spec with
any GPU marker never bypasses Python (or the runtime service); a create the dispatcher passes
straight to the runtime is one that the Python shim would pass through too (same bundle, no
marker). The service's side of the wire is checked against a stand-in service here, and
end to end in test_runtime_service.py.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuhook import markers
from gpuhook.config import cache as config_cache
from gpuhook.config import locate
from gpuhook.records import execenv
from gpuhook.runtime import dispatch, runc_argv, wire
from tests import runc_grammar
from tests.hostguard import session_env

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
SAYS = "#!/bin/sh\necho {name}\n"
NO_MARKER = b'{"ociVersion": "1.0.2", "process": {"env": ["PATH=/bin"]}}'
MARKED = [
    b'{"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}}',
    b'{"annotations": {"cdi.k8s.io/x": "nvidia.com/gpu=0"}}',
    b'{"mounts": [{"destination": "/var/run/nvidia-container-devices/all"}]}',
    b'{"hooks": {"prestart": [{"path": "/usr/bin/nvidia-container-runtime-hook"}]}}',
    b'{"process": {"env": ["\\u004eVIDIA_VISIBLE_DEVICES=all"]}}',
]


class Node:
    """A rendered dispatcher, its pointer, and a scratch folder for bundles."""

    def __init__(self, root: Path) -> None:
        self.root = root
        for name in ("python", "runtime"):
            path = root / name
            path.write_text(SAYS.format(name=name))
            path.chmod(0o755)
        self.state = root / "state"
        self.state.mkdir()
        self.config = root / "config.yaml"
        self.config.write_text("{}\n")
        self.dispatcher = root / "gpuhook-runtime"
        template = (REPO / "packaging" / "gpuhook-runtime.c.in").read_text()
        dispatch.compile_c(
            dispatch.render_c(template), str(self.dispatcher), [str(root / "python")]
        )
        self.socket = ""
        cache_dir = Path(config_cache.cache_dir_for(str(self.config)))
        self.pointer = cache_dir / config_cache.POINTER_NAME
        self.pointer.parent.mkdir(parents=True, exist_ok=True)
        self.write_pointer()

    def write_pointer(self, level: str = "info") -> None:
        self.pointer.write_text(f"{self.root / 'runtime'}\n{self.state}\n{level}\n{self.socket}\n")
        self.pointer.chmod(config_cache.POINTER_MODE)

    def run(self, argv: list[str], cwd: Path, **env: str) -> str:
        return self.call(argv, cwd, **env).stdout.strip()

    def call(self, argv: list[str], cwd: Path, **env: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.dispatcher), *argv],
            cwd=cwd,
            env={**session_env(), "GPUHOOK_CONFIG": str(self.config), **env},
            capture_output=True,
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
        )


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Node:
    return Node(tmp_path_factory.mktemp("dispatcher"))


def bundles(
    node: Node,
    argv: list[str],
    spec: bytes,
    cwd_spec: bytes,
    bundle: str | None = None,
    other: bytes | None = None,
) -> Path:
    """Every path in the argv becomes a folder holding a config.json: ``bundle`` (the path the
    argv means as its bundle) ``spec``, every other one ``other`` (default ``spec``); the cwd
    holds ``cwd_spec``. A dispatcher that reads the wrong one takes the wrong path."""
    top = node.root / "b"
    for arg in argv:
        value = arg.partition("=")[2] if arg.startswith("-") else arg
        if value.startswith("/"):
            folder = top / value.lstrip("/")
            folder.mkdir(parents=True, exist_ok=True)
            mine = spec if other is None or value == bundle else other
            (folder / "config.json").write_bytes(mine)
    cwd = node.root / "cwd"
    cwd.mkdir(exist_ok=True)
    (cwd / "config.json").write_bytes(cwd_spec)
    return top


def relocate(argv: list[str], top: Path) -> list[str]:
    def move(text: str) -> str:
        return str(top) + text if text.startswith("/") else text

    out = []
    for arg in argv:
        name, eq, value = arg.partition("=")
        out.append(f"{name}={move(value)}" if arg.startswith("-") and eq else move(arg))
    return out


def python_path(argv: list[str], cwd: Path) -> str:
    """What the Python shim does: 'runtime' when it passes the call through untouched."""
    args = runc_argv.parse(argv)
    how = runc_argv.route(args, argv)
    if how == runc_argv.CREATE:
        raw = (cwd / (args.bundle or ".") / "config.json").read_bytes()
        return "python" if markers.may_request_gpu(raw) else "runtime"
    return "runtime" if how in (runc_argv.PASS, runc_argv.DELETE, runc_argv.EXEC) else "python"


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(
    case=runc_grammar.argv(),
    marked=st.sampled_from([None, *MARKED]),
    cwd_marked=st.booleans(),
)
def test_dispatcher_and_python_agree_on_runc_grammar(
    node: Node, case: tuple[list[str], dict[str, str]], marked: bytes | None, cwd_marked: bool
) -> None:
    argv, want = case
    spec = marked or NO_MARKER
    opposite = NO_MARKER if marked else MARKED[0]  # in every path that is not the bundle
    cwd_spec = MARKED[0] if cwd_marked else NO_MARKER
    top = bundles(node, argv, spec, cwd_spec, bundle=want.get("bundle"), other=opposite)
    argv = relocate(argv, top)
    cwd = node.root / "cwd"
    took = node.run(argv, cwd)
    assert took == python_path(argv, cwd), argv
    args = runc_argv.parse(argv)
    if args.is_create:
        spec = (cwd / (args.bundle or ".") / "config.json").read_bytes()
        if markers.may_request_gpu(spec):
            assert took == "python", argv  # a marker never bypasses Python


_junk = st.sampled_from(["--new-flag", "-x", "--", "-", "--bundle", "-b=", "---b", "create", "id"])


@settings(max_examples=100, deadline=None, suppress_health_check=list(HealthCheck))
@given(case=runc_grammar.argv(["create", "run", "restore"]), junk=_junk, at=st.integers(0, 12))
def test_argvs_no_grammar_knows_go_to_python(
    node: Node, case: tuple[list[str], dict[str, str]], junk: str, at: int
) -> None:
    argv, _ = case
    argv = [*argv[:at], junk, *argv[at:]]
    top = bundles(node, argv, MARKED[0], NO_MARKER)
    argv = relocate(argv, top)
    cwd = node.root / "cwd"
    took = node.run(argv, cwd)
    assert took in ("python", "runtime"), argv
    if took == "runtime":  # then Python would have passed the same create through
        assert python_path(argv, cwd) == "runtime", argv
        assert runc_argv.route(runc_argv.parse(argv), argv) != runc_argv.REFUSE


def test_unusual_cases_go_to_python(node: Node) -> None:
    cwd = node.root / "cwd"
    cwd.mkdir(exist_ok=True)
    (cwd / "config.json").write_bytes(NO_MARKER)
    create = ["--root", "/r", "create", "c1"]
    assert node.run(create, cwd) == "runtime"
    assert node.run(create, cwd, GPUHOOK_DEBUG="1") == "python"
    assert node.run(["--version"], cwd) == "python"
    node.write_pointer("debug")
    assert node.run(create, cwd) == "python"
    node.write_pointer()
    unreadable = node.root / "unreadable"  # not a file it can scan (root reads any mode): Python
    (unreadable / "config.json").mkdir(parents=True)
    assert node.run(["create", "--bundle", str(unreadable), "c1"], cwd) == "python"
    # exec and delete: Python only for a container whose create left an exec-env marker.
    assert node.run(["exec", "-p", "/p.json", "c1"], cwd) == "runtime"
    marker = node.state / execenv.DIR / "c1"
    marker.parent.mkdir(exist_ok=True)
    marker.write_text('{"root": "", "set": [], "unset": []}')
    assert node.run(["exec", "-p", "/p.json", "c1"], cwd) == "python"
    assert node.run(["create", "c1"], cwd) == "python"  # a stale marker: Python removes it
    assert node.run(["delete", "c1"], cwd) == "runtime"
    assert not marker.exists()  # the delete succeeded


def test_a_marked_delete_killed_by_a_signal_exits_128_plus_the_signal_on_both_paths(
    tmp_path: Path,
) -> None:
    """The dispatcher and the Python shim both run the runtime's delete of a container with an
    exec-env marker and wait for it: a runtime killed by SIGKILL is exit code 137 from either
    (as a shell reports it), and the marker stays for the retry."""
    runtime = tmp_path / "runtime"
    runtime.write_text("#!/bin/sh\nkill -9 $$\n")
    runtime.chmod(0o755)
    state = tmp_path / "state"
    marker = state / execenv.DIR / "c1"
    marker.parent.mkdir(parents=True)
    marker.write_text('{"root": "", "set": [], "unset": []}')
    cfg = tmp_path / "config.yaml"
    cfg.write_text(f"state_dir: {state}\nruntime:\n  path: {runtime}\n  service: ''\n")
    entry = REPO / "src" / "gpuhook" / locate.SHIM_ENTRY
    dispatcher = tmp_path / "gpuhook-runtime"
    template = (REPO / "packaging" / "gpuhook-runtime.c.in").read_text()
    dispatch.compile_c(
        dispatch.render_c(template), str(dispatcher), [sys.executable, "-I", "-S", str(entry)]
    )
    env = {**session_env(), "GPUHOOK_CONFIG": str(cfg)}
    for argv in ([sys.executable, "-I", "-S", str(entry)], [str(dispatcher)]):
        out = subprocess.run(
            [*argv, "delete", "c1"], env=env, capture_output=True, text=True, check=False
        )
        assert out.returncode == 137, (argv, out.stderr)
        assert marker.exists()


HOWS = ["control", "root-0600", "symlink", "owner", "chmod-664", "chmod-646", "folder"]


@pytest.mark.parametrize("how", HOWS)
def test_pointer_trust_is_the_python_rule(node: Node, how: str) -> None:
    """The dispatcher acts on the pointer only when gpuhook.config.cache.trusted_file trusts it (a
    regular file, not a link, owned by root or this user, writable by no one else)."""
    cwd = node.root / "cwd"
    cwd.mkdir(exist_ok=True)
    node.write_pointer()
    real = node.pointer.with_name("real")
    if how == "symlink":
        real.write_text(node.pointer.read_text())
        real.chmod(config_cache.POINTER_MODE)
        node.pointer.unlink()
        node.pointer.symlink_to(real)
    elif how == "owner":
        os.chown(node.pointer, 65534, 65534)
    elif how == "root-0600":
        node.pointer.chmod(0o600)
    elif how == "folder":
        node.pointer.unlink()
        node.pointer.mkdir()
    elif how != "control":
        node.pointer.chmod(0o664 if how == "chmod-664" else 0o646)
    st = os.lstat(node.pointer)
    trusted = config_cache.trusted_file(st)
    try:
        assert node.run(["state", "c1"], cwd) == ("runtime" if trusted else "python")
        assert trusted == (how in ("control", "root-0600"))
    finally:
        if node.pointer.is_dir() and not node.pointer.is_symlink():
            node.pointer.rmdir()
        else:
            node.pointer.unlink()
        real.unlink(missing_ok=True)
        node.write_pointer()


def test_the_pointer_is_read_in_the_folder_gpuhook_cache_dir_names(
    node: Node, tmp_path: Path
) -> None:
    """The dispatcher finds the pointer where Python writes it (gpuhook.config.cache.cache_root):
    under GPUHOOK_CACHE_DIR; a folder without it, or a value that is not a plain absolute path,
    leaves the call to Python."""
    cwd = node.root / "cwd"
    cwd.mkdir(exist_ok=True)
    assert str(node.pointer).startswith(os.environ["GPUHOOK_CACHE_DIR"] + "/")
    assert node.run(["state", "c1"], cwd) == "runtime"
    moved = tmp_path / "elsewhere"
    target = moved / node.pointer.relative_to(os.environ["GPUHOOK_CACHE_DIR"])
    target.parent.mkdir(parents=True)
    target.write_bytes(node.pointer.read_bytes())
    target.chmod(config_cache.POINTER_MODE)
    assert node.run(["state", "c1"], cwd, GPUHOOK_CACHE_DIR=str(moved)) == "runtime"
    for other in (str(tmp_path / "empty"), "relative", f"{moved}/.", f"{tmp_path}/../{moved}"):
        assert node.run(["state", "c1"], cwd, GPUHOOK_CACHE_DIR=other) == "python", other


class FakeService:
    """A runtime service that answers one call with ``answer`` (None: closes without one) and
    keeps what it received: the request's words, and where its descriptors point."""

    def __init__(
        self, path: Path, answer: bytes | None, meanwhile: Callable[[], None] | None = None
    ) -> None:
        """``meanwhile``: what it does before it answers (or closes)."""
        self.path = path
        self.answer = answer
        self.meanwhile = meanwhile
        self.words: list[str] = []
        self.fds: list[str] = []
        path.unlink(missing_ok=True)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self.sock.bind(str(path))
        self.sock.listen(1)
        self.thread = threading.Thread(target=self.serve, daemon=True)
        self.thread.start()

    def serve(self) -> None:
        try:
            conn, _ = self.sock.accept()
        except OSError:  # closed by the test: no call came
            return
        with conn:
            data, fds, _, _ = socket.recv_fds(conn, wire.MAX_REQUEST, 8)
            self.words = [w.decode() for w in data.split(b"\0")[:-1]]
            self.fds = [os.readlink(f"/proc/self/fd/{fd}") for fd in fds]
            for fd in fds:
                os.close(fd)
            if self.meanwhile is not None:
                self.meanwhile()
            if self.answer is not None:
                conn.send(self.answer)

    def close(self) -> None:
        self.thread.join(timeout=10)
        self.sock.close()
        self.path.unlink(missing_ok=True)


@pytest.fixture
def served(node: Node) -> Iterator[Node]:
    node.socket = str(node.root / "service.sock")
    node.write_pointer()
    yield node
    node.socket = ""
    node.write_pointer()


ANSWERS = {
    "exec": (wire.EXEC + b"{runtime}", 0, "runtime"),
    "exit": (wire.EXIT + b"7", 7, ""),
    "decline": (wire.DECLINE + b"another mount namespace", 0, "python"),
}


@pytest.mark.parametrize("answer", sorted(ANSWERS))
def test_a_marked_create_is_offered_to_the_service(served: Node, answer: str) -> None:
    """The request carries the argv (argv[0]: the dispatcher), the environment with
    GPUHOOK_SELF, and the caller's stdio and working folder; the dispatcher does what the answer
    says: exec the runtime named, exit with the code given, or start Python itself."""
    node = served
    cwd = node.root / "cwd"
    cwd.mkdir(exist_ok=True)
    (cwd / "config.json").write_bytes(MARKED[0])
    raw, code, took = ANSWERS[answer]
    fake = FakeService(Path(node.socket), raw.replace(b"{runtime}", bytes(node.root / "runtime")))
    try:
        done = node.call(["--log", str(cwd / "log.json"), "create", "c1"], cwd, KEEP="x y")
    finally:
        fake.close()
    assert (done.returncode, done.stdout.strip()) == (code, took)
    words = fake.words
    assert words[:3] == [wire.PROTOCOL.decode(), "5", str(node.dispatcher)]
    assert words[3:7] == ["--log", str(cwd / "log.json"), "create", "c1"]
    env = words[8 : 8 + int(words[7])]
    assert len(words) == 8 + int(words[7])
    assert f"GPUHOOK_SELF={node.dispatcher}" in env and "KEEP=x y" in env
    assert f"GPUHOOK_CONFIG={node.config}" in env
    assert fake.fds[0] == "/dev/null" and fake.fds[3] == str(cwd)
    assert len(fake.fds) == wire.FDS


def test_a_service_that_ends_the_call_without_an_answer_leaves_it_to_python(
    served: Node,
) -> None:
    """The service died mid-call (killed, restarted, upgraded) after rewriting the spec: the
    dispatcher puts config.json back as the engine wrote it (atomically, no temp file left) and
    Python decides the create whole, as without a service."""
    node = served
    cwd = node.root / "cwd"
    cwd.mkdir(exist_ok=True)
    spec = cwd / "config.json"
    spec.write_bytes(MARKED[1])
    spec.chmod(0o640)

    def half_done() -> None:
        half = cwd / "half.json"
        half.write_bytes(b'{"half": "written by a worker that died"}')
        os.replace(half, spec)

    fake = FakeService(Path(node.socket), None, half_done)
    try:
        done = node.call(["create", "c1"], cwd)
    finally:
        fake.close()
    assert (done.returncode, done.stdout, done.stderr) == (0, "python\n", "")
    assert spec.read_bytes() == MARKED[1]
    assert spec.stat().st_mode & 0o777 == 0o640
    assert sorted(os.listdir(cwd)) == ["config.json"]
    marker = node.state / execenv.DIR / "c1"  # an exec of a marked container: nothing to put back
    marker.parent.mkdir(exist_ok=True)
    marker.write_text("{}")
    fake = FakeService(Path(node.socket), None)
    try:
        assert node.run(["exec", "c1"], cwd) == "python"
    finally:
        fake.close()
        marker.unlink()


def test_a_spec_that_cannot_be_put_back_fails_the_create_in_one_line(served: Node) -> None:
    """The service ended the call without an answer and config.json cannot be put back (here a
    folder took its place): the create fails (one line on stderr and in runc's --log file), it
    is never passed on half-decided."""
    node = served
    cwd = node.root / "cwd2"
    cwd.mkdir(exist_ok=True)
    spec = cwd / "config.json"
    spec.write_bytes(MARKED[1])
    log = cwd / "log.json"
    log.unlink(missing_ok=True)

    def folder_instead() -> None:
        spec.unlink()
        spec.mkdir()
        (spec / "x").write_text("")

    fake = FakeService(Path(node.socket), None, folder_instead)
    try:
        done = node.call(["--log", str(log), "--log-format", "json", "create", "c1"], cwd)
    finally:
        fake.close()
        shutil.rmtree(spec)
    line = (
        f"gpuhook: the runtime service at {node.socket} ended the call without an answer and "
        f"./config.json could not be put back as the engine wrote it"
    )
    assert done.returncode == 1 and done.stdout == ""
    assert done.stderr.startswith(line) and done.stderr.count("\n") == 1
    entry = json.loads(log.read_text())
    assert entry["level"] == "error" and entry["msg"].startswith(line)


def test_without_a_listening_service_python_decides(served: Node) -> None:
    """Nothing listens (no socket file, or a stale one): Python starts here, as without a
    service; a create without any marker never contacts the service."""
    node = served
    cwd = node.root / "cwd"
    cwd.mkdir(exist_ok=True)
    (cwd / "config.json").write_bytes(MARKED[2])
    assert node.run(["create", "c1"], cwd) == "python"
    stale = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    stale.bind(node.socket)
    stale.close()  # the file stays, nobody listens
    try:
        assert node.run(["create", "c1"], cwd) == "python"
    finally:
        Path(node.socket).unlink()
    (cwd / "config.json").write_bytes(NO_MARKER)
    fake = FakeService(Path(node.socket), wire.EXIT + b"9")
    try:
        assert node.run(["create", "c1"], cwd) == "runtime"
    finally:
        fake.sock.shutdown(socket.SHUT_RDWR)  # no call came: end the thread's accept
        fake.sock.close()
        fake.thread.join(timeout=10)
        Path(node.socket).unlink(missing_ok=True)
    assert fake.words == []


EVIL_SERVICE = """
import os, socket, sys
os.chdir("/")
os.setgid(65534)
os.setuid(65534)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
sock.bind(sys.argv[1])
os.chmod(sys.argv[1], 0o666)
sock.listen(1)
print("ready", flush=True)
sock.settimeout(5)
try:
    conn, _ = sock.accept()
except OSError:
    print("never asked", flush=True)
    sys.exit()
conn.settimeout(5)
if conn.recv(1 << 20):  # a call: answer it with what root should exec
    conn.send(b"X" + sys.argv[2].encode())
    print("asked", flush=True)
else:  # the dispatcher connected (to read who listens) and closed without a word
    print("never asked", flush=True)
"""


def test_a_service_of_another_user_is_never_asked(served: Node, tmp_path: Path) -> None:
    """A socket at the configured path that another user listens on (a socket path in a folder
    others can write: the operator's mistake) is never sent a call, so it cannot name what root
    execs: the dispatcher starts Python itself."""
    node = served
    folder = Path(tempfile.mkdtemp(prefix="gpuhook-open-"))  # reachable by user nobody
    folder.chmod(0o777)
    node.socket = str(folder / "s.sock")
    node.write_pointer()
    evil = tmp_path / "evil"
    evil.write_text(SAYS.format(name="evil"))
    evil.chmod(0o755)
    cwd = node.root / "cwd"
    cwd.mkdir(exist_ok=True)
    (cwd / "config.json").write_bytes(MARKED[0])
    proc = subprocess.Popen(
        [sys.executable, "-c", EVIL_SERVICE, node.socket, str(evil)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        assert node.run(["create", "c1"], cwd) == "python"
        assert proc.stdout.readline().strip() == "never asked"
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(folder)
