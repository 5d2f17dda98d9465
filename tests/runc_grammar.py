"""runc's and crun's command lines, written from their documentation (``runc --help``,
``runc create --help``, ``runc run --help``, ``runc restore --help``, ``runc exec --help``,
``runc delete --help`` of runc 1.1.5; runc 1.2's ``--pidfd-socket``; crun 1.x's global flags),
NOT from gpuhook's parser tables: a hypothesis strategy for valid argvs and what they mean.

Go's flag package (runc) takes ``-name value``, ``--name value``, ``-name=value`` and
``--name=value``; boolean flags take no separate value. runc reorders a create's flags, so they
may come after the container id; an exec's arguments after the id are the process's argv.
"""

from __future__ import annotations

from hypothesis import strategies as st

# (names, takes a value)
Table = list[tuple[tuple[str, ...], bool]]
GLOBAL: Table = [
    (("debug",), False),
    (("log",), True),
    (("log-format",), True),
    (("root",), True),
    (("criu",), True),
    (("systemd-cgroup",), False),
    (("rootless",), True),
    (("cgroup-manager",), True),  # crun
]
CREATE: Table = [
    (("bundle", "b"), True),
    (("console-socket",), True),
    (("pid-file",), True),
    (("no-pivot",), False),
    (("no-new-keyring",), False),
    (("preserve-fds",), True),
    (("pidfd-socket",), True),  # runc 1.2
]
RUN = [*CREATE, (("detach", "d"), False), (("keep",), False), (("no-subreaper",), False)]
RESTORE: Table = [
    (("console-socket",), True),
    (("image-path",), True),
    (("work-path",), True),
    (("tcp-established",), False),
    (("ext-unix-sk",), False),
    (("shell-job",), False),
    (("file-locks",), False),
    (("manage-cgroups-mode",), True),
    (("bundle", "b"), True),
    (("detach", "d"), False),
    (("pid-file",), True),
    (("no-subreaper",), False),
    (("no-pivot",), False),
    (("empty-ns",), True),
    (("auto-dedup",), False),
    (("lazy-pages",), False),
    (("lsm-profile",), True),
    (("lsm-mount-context",), True),
]
EXEC: Table = [
    (("console-socket",), True),
    (("cwd",), True),
    (("env", "e"), True),
    (("tty", "t"), False),
    (("user", "u"), True),
    (("additional-gids", "g"), True),
    (("process", "p"), True),
    (("detach", "d"), False),
    (("pid-file",), True),
    (("process-label",), True),
    (("apparmor",), True),
    (("no-new-privs",), False),
    (("cap", "c"), True),
    (("preserve-fds",), True),
    (("cgroup",), True),
    (("ignore-paused",), False),
]
DELETE: Table = [(("force", "f"), False)]
COMMANDS: dict[str, Table] = {
    "create": CREATE, "run": RUN, "restore": RESTORE, "exec": EXEC, "delete": DELETE
}  # fmt: skip
OTHER_COMMANDS = ["start", "state", "kill", "list", "ps", "pause", "resume", "events", "update"]

paths = st.text(alphabet="abcdefghijklmnopqrstuvwxyz._-", min_size=1, max_size=10).map(
    lambda s: "/" + s
)
ids = st.text(alphabet="abcdef0123456789-_.", min_size=1, max_size=12).filter(
    lambda s: not s.startswith("-") and s not in (".", "..")
)


@st.composite
def flag(draw: st.DrawFn, names: tuple[str, ...], value: str | None) -> list[str]:
    name = draw(st.sampled_from(names))
    dash = draw(st.sampled_from(["-", "--"]))
    if value is None:
        return [dash + name]
    if draw(st.booleans()):
        return [f"{dash}{name}={value}"]
    return [dash + name, value]


@st.composite
def _flags(
    draw: st.DrawFn, table: list[tuple[tuple[str, ...], bool]], want: dict[str, str]
) -> list[str]:
    out: list[str] = []
    for names, takes in draw(st.lists(st.sampled_from(table), max_size=4)):
        value = draw(paths) if takes else None
        if names[0] == "log-format":
            value = draw(st.sampled_from(["json", "text"]))
        if value is not None:
            want[names[0]] = value
        out += draw(flag(names, value))
    return out


@st.composite
def argv(draw: st.DrawFn, commands: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
    """A valid argv and what it means: command, id, bundle, root, log, log-format, process."""
    want: dict[str, str] = {}
    out = draw(_flags(GLOBAL, want))
    command = draw(st.sampled_from(commands or [*COMMANDS, *OTHER_COMMANDS]))
    want = {k: v for k, v in want.items() if k in ("root", "log", "log-format")}
    want["command"] = command
    out.append(command)
    table = COMMANDS.get(command)
    cid = draw(ids)
    if table is None:
        return [*out, cid], want
    sub: dict[str, str] = {}
    before = draw(_flags(table, sub))
    after = draw(_flags(table, sub)) if command != "exec" else []
    if "bundle" in sub:
        want["bundle"] = sub["bundle"]
    if "process" in sub:
        want["process"] = sub["process"]
    want["id"] = cid
    tail = draw(st.lists(st.sampled_from(["sh", "-c", "ls -l"]), max_size=3))
    return [*out, *before, cid, *after, *(tail if command == "exec" else [])], want
