"""runc argv parsing: examples from docker/containerd, and a grammar-based property test."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpuhook.runtime.runc_argv import CREATE, DELETE, EXEC, PASS, REFUSE, parse, route
from tests import runc_grammar


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


@settings(max_examples=500, deadline=None)
@given(runc_grammar.argv())
def test_parse_recovers_what_the_grammar_generated(case: tuple[list[str], dict[str, str]]) -> None:
    """argvs generated from runc's documented grammar (tests/runc_grammar.py), flags before and
    after the id, ``=`` and two-word forms, single and double dashes."""
    argv, want = case
    before = list(argv)
    args = parse(argv)
    assert argv == before  # never modified
    assert args.unknown == ""
    assert args.command == want["command"]
    assert args.log_path == want.get("log", "")
    assert args.root == want.get("root", "")
    assert args.log_format == want.get("log-format", "text")
    if want["command"] in runc_grammar.COMMANDS:
        assert args.bundle == want.get("bundle", "")
        assert args.container_id == want["id"]
        assert args.process == want.get("process", "")
        expected = {"exec": EXEC, "delete": DELETE}.get(want["command"], CREATE)
        assert route(args, argv) == expected


def test_forms_runc_and_crun_accept() -> None:
    """Issue 16.2: flags after the id, --pidfd-socket, crun's two-word global flags, restore."""
    args = parse(["create", "ID", "--bundle", "/b"])
    assert (args.container_id, args.bundle, route(args, [])) == ("ID", "/b", CREATE)
    args = parse(["--cgroup-manager", "systemd", "create", "--pidfd-socket", "/s", "-b", "/b", "i"])
    assert (args.container_id, args.bundle) == ("i", "/b")
    args = parse(["restore", "--image-path", "/img", "c1", "--bundle=/b"])
    assert (args.command, args.container_id, args.bundle, route(args, [])) == (
        "restore",
        "c1",
        "/b",
        CREATE,
    )


def test_unknown_flags_never_pass_a_create_through() -> None:
    for argv in (
        ["create", "--new-flag", "x", "id"],
        ["--new-global", "create", "id"],
        ["create", "--bundle"],
        ["create", "id", "--", "x"],
        ["create", "-f", "/spec.json", "id"],  # crun's --config: the spec is elsewhere
    ):
        args = parse(argv)
        assert args.unknown, argv
        assert route(args, argv) == REFUSE, argv
    args = parse(["--new-global", "state", "id"])
    assert route(args, ["--new-global", "state", "id"]) == PASS


def test_an_exec_behind_an_unknown_flag_still_goes_to_the_exec_path() -> None:
    """The exec path adds a GPU container's env (or refuses when it cannot tell which container
    is meant); an unknown global flag must not turn that into a silent pass-through."""
    for argv in (
        ["--new-global", "exec", "--process", "/p", "c1"],
        ["exec", "--new-flag", "--process", "/p", "c1"],
    ):
        assert route(parse(argv), argv) == EXEC, argv


@settings(max_examples=300, deadline=None)
@given(st.lists(st.text(max_size=8), max_size=8))
def test_parse_never_raises(argv: list[str]) -> None:
    parse(argv)
