"""The installed sh dispatcher and the Python shim take the same path for every argv and spec.

The dispatcher is rendered from packaging/gpuhook-runtime.in by the build step
(gpuhook.runtime.dispatch) with a stand-in for Python that only says it was started, and a
runtime pointer naming a recorder. argvs come from runc's own documented grammar
(tests/runc_grammar.py), plus argvs with flags no grammar knows. A spec with any GPU marker
never bypasses Python; a create the dispatcher passes straight to the runtime is one that the
Python shim would pass through too (same bundle, no marker).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from gpuhook import config as config_mod
from gpuhook import markers
from gpuhook.records import execenv
from gpuhook.runtime import dispatch, runc_argv
from tests import runc_grammar

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
        template = (REPO / "packaging" / "gpuhook-runtime.in").read_text()
        self.dispatcher.write_text(dispatch.render(template, str(root / "python"), "/nowhere"))
        self.dispatcher.chmod(0o755)
        self.pointer = Path(config_mod.cache_dir_for(str(self.config))) / config_mod.POINTER_NAME
        self.pointer.parent.mkdir(parents=True, exist_ok=True)
        self.write_pointer()

    def write_pointer(self, level: str = "info") -> None:
        self.pointer.write_text(f"{self.root / 'runtime'}\n{self.state}\n{level}\n")
        self.pointer.chmod(config_mod.POINTER_MODE)

    def run(self, argv: list[str], cwd: Path, **env: str) -> str:
        out = subprocess.run(
            [str(self.dispatcher), *argv],
            cwd=cwd,
            env={"PATH": os.environ["PATH"], "GPUHOOK_CONFIG": str(self.config), **env},
            capture_output=True,
            text=True,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        return out.stdout.strip()


@pytest.fixture(scope="module")
def node(tmp_path_factory: pytest.TempPathFactory) -> Node:
    return Node(tmp_path_factory.mktemp("dispatcher"))


def bundles(node: Node, argv: list[str], spec: bytes, cwd_spec: bytes) -> Path:
    """Every path in the argv becomes a bundle holding ``spec``; the cwd holds ``cwd_spec``, so
    a dispatcher that reads the wrong one takes the wrong path."""
    top = node.root / "b"
    for arg in argv:
        value = arg.partition("=")[2] if arg.startswith("-") else arg
        if value.startswith("/"):
            folder = top / value.lstrip("/")
            folder.mkdir(parents=True, exist_ok=True)
            (folder / "config.json").write_bytes(spec)
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
def test_sh_and_python_agree_on_runc_grammar(
    node: Node, case: tuple[list[str], dict[str, str]], marked: bytes | None, cwd_marked: bool
) -> None:
    argv, _ = case
    top = bundles(node, argv, marked or NO_MARKER, MARKED[0] if cwd_marked else NO_MARKER)
    argv = relocate(argv, top)
    cwd = node.root / "cwd"
    sh = node.run(argv, cwd)
    assert sh == python_path(argv, cwd), argv
    args = runc_argv.parse(argv)
    if args.is_create:
        spec = (cwd / (args.bundle or ".") / "config.json").read_bytes()
        if markers.may_request_gpu(spec):
            assert sh == "python", argv  # a marker never bypasses Python


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
    sh = node.run(argv, cwd)
    if sh == "runtime":  # then Python would have passed the same create through
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
    unreadable = node.root / "unreadable"  # grep cannot read it (root reads any mode): Python
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


def write_as_nobody(path: Path, text: str) -> None:
    """Overwrite ``path`` from a process of user nobody (no capabilities), as an attacker would
    who found it writable."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            os.setgid(65534)
            os.setuid(65534)
            with open(path, "w") as fh:
                fh.write(text)
            os._exit(0)
        except BaseException:
            os._exit(1)
    assert os.waitpid(pid, 0)[1] == 0


# "chmod-664"/"chmod-646": an operator's octal chmod, which also sets the set-user-ID bit to 0;
# "written-by-another-user": the witness kept by root's mistake, then a write by user nobody.
HOWS = ["control", "symlink", "owner", "chmod-664", "chmod-646", "no-witness"]


@pytest.mark.parametrize("how", [*HOWS, "written-by-another-user"])
def test_pointer_trust_is_the_python_rule(node: Node, how: str) -> None:
    """The dispatcher acts on the pointer only when gpuhook.config.trusted_file trusts it and it
    still carries the witness of being unchanged since gpuhook wrote it; a pointer that someone
    else could write, and then did, is never acted on."""
    cwd = node.root / "cwd"
    cwd.mkdir(exist_ok=True)
    node.write_pointer()
    real = node.pointer.with_name("real")
    if how == "symlink":
        real.write_text(node.pointer.read_text())
        real.chmod(config_mod.POINTER_MODE)
        node.pointer.unlink()
        node.pointer.symlink_to(real)
    elif how == "owner":
        os.chown(node.pointer, 65534, 65534)
    elif how == "no-witness":
        node.pointer.chmod(0o644)
    elif how == "written-by-another-user":
        node.pointer.chmod(config_mod.POINTER_MODE | 0o666)  # root's mistake: world-writable
        assert node.run(["state", "c1"], cwd) == "runtime"  # nothing changed it yet
        write_as_nobody(node.pointer, node.pointer.read_text())  # the kernel drops the witness
    elif how != "control":
        node.pointer.chmod(0o664 if how == "chmod-664" else 0o646)
    st = os.lstat(node.pointer)
    trusted = config_mod.trusted_file(os.stat(node.pointer)) and not os.path.islink(node.pointer)
    witness = bool(st.st_mode & 0o4000)
    try:
        assert node.run(["state", "c1"], cwd) == ("runtime" if trusted and witness else "python")
        assert (trusted and witness) == (how == "control")
    finally:
        node.pointer.unlink()
        real.unlink(missing_ok=True)
        node.write_pointer()
