"""runc argv parsing: examples from docker/containerd, and a grammar-based property test."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhook.runtime.runc_argv import parse


def test_containerd_shim_create() -> None:
    argv = [
        "--root",
        "/run/containerd/runc/k8s.io",
        "--log",
        "/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc/log.json",
        "--log-format",
        "json",
        "--systemd-cgroup",
        "create",
        "--bundle",
        "/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc",
        "--pid-file",
        "/run/x/init.pid",
        "abc",
    ]
    args = parse(argv)
    assert args.command == "create" and args.is_create
    assert args.bundle == "/run/containerd/io.containerd.runtime.v2.task/k8s.io/abc"
    assert args.container_id == "abc"
    assert args.log_path.endswith("log.json") and args.log_format == "json"
    assert args.root == "/run/containerd/runc/k8s.io"


def test_single_dash_and_equals_forms() -> None:
    args = parse(["-root=/r", "-log", "/l", "run", "-b=/bundle", "-d", "id1"])
    assert (args.command, args.bundle, args.container_id, args.root, args.log_path) == (
        "run",
        "/bundle",
        "id1",
        "/r",
        "/l",
    )


def test_passthrough_commands_are_not_create() -> None:
    assert parse(["--root", "/r", "delete", "--force", "abc"]).command == "delete"
    assert not parse(["state", "create"]).is_create  # "create" as a container id
    assert parse(["--log", "create", "list"]).command == "list"  # "create" as a flag value


def test_version_alone() -> None:
    assert parse(["--version"]).version
    assert not parse(["--version", "list"]).version


_paths = st.text(alphabet="abcdefghijklmnopqrstuvwxyz/._-", min_size=1, max_size=20).map(
    lambda s: "/" + s
)
_ids = st.text(alphabet="abcdef0123456789-_.", min_size=1, max_size=12).filter(
    lambda s: not s.startswith("-")
)


@st.composite
def _flag(draw: st.DrawFn, name: str, value: str | None) -> list[str]:
    dash = draw(st.sampled_from(["-", "--"]))
    if value is None:
        return [dash + name]
    if draw(st.booleans()):
        return [f"{dash}{name}={value}"]
    return [dash + name, value]


@st.composite
def _argv(draw: st.DrawFn) -> tuple[list[str], dict[str, str]]:
    argv: list[str] = []
    want: dict[str, str] = {}
    for name in draw(
        st.lists(
            st.sampled_from(
                ["root", "log", "log-format", "criu", "debug", "systemd-cgroup", "rootless"]
            ),
            unique=True,
            max_size=5,
        )
    ):
        value = None if name in ("debug", "systemd-cgroup") else draw(_paths)
        if name == "log-format":
            value = draw(st.sampled_from(["json", "text"]))
        if value is not None:
            want[name] = value
        argv += draw(_flag(name, value))
    command = draw(st.sampled_from(["create", "run", "start", "state", "kill", "delete"]))
    argv.append(command)
    want["command"] = command
    if command in ("create", "run"):
        for name in draw(
            st.lists(
                st.sampled_from(
                    [
                        "bundle",
                        "b",
                        "console-socket",
                        "pid-file",
                        "no-pivot",
                        "no-new-keyring",
                        "detach",
                    ]
                ),
                unique=True,
                max_size=4,
            )
        ):
            if name in ("b", "bundle") and "bundle" in want:
                continue
            value = None if name in ("no-pivot", "no-new-keyring", "detach") else draw(_paths)
            if name in ("b", "bundle"):
                want["bundle"] = value or ""
            argv += draw(_flag(name, value))
        cid = draw(_ids)
        want["id"] = cid
        argv.append(cid)
    else:
        argv.append(draw(_ids))
    return argv, want


@settings(max_examples=500, deadline=None)
@given(_argv())
def test_parse_recovers_what_the_grammar_generated(case: tuple[list[str], dict[str, str]]) -> None:
    argv, want = case
    before = list(argv)
    args = parse(argv)
    assert argv == before  # never modified
    assert args.command == want["command"]
    assert args.log_path == want.get("log", "")
    assert args.root == want.get("root", "")
    assert args.log_format == want.get("log-format", "text")
    if want["command"] in ("create", "run"):
        assert args.bundle == want.get("bundle", "")
        assert args.container_id == want["id"]


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=8), max_size=8))
def test_parse_never_raises(argv: list[str]) -> None:
    parse(argv)
