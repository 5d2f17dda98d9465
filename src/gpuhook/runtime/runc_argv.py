"""Parse a runc command line (pure). gpuhook-runtime is argv-compatible with runc and crun.

The grammar is one table (:data:`GLOBAL_FLAGS`, :data:`COMMAND_FLAGS`): this parser reads it, and
the installed dispatcher's parser is generated from it at build time
(:mod:`gpuhook.runtime.dispatch`), so both place the bundle and the container id the same way.

runc (urfave/cli on Go's flag package) and crun (argp) accept ``--flag value``, ``--flag=value``
and ``-f value`` / ``-f=value`` (runc also ``-flag value``). Global flags come before the
subcommand. A create's flags may come before or after the container id (runc reorders them;
argp permutes them); an exec's flags come before the id, and what follows the id is the
process's own argv. A flag that is not in the table, a ``--``, or a value flag without its value
makes the argv one the parser cannot place (:attr:`RuntimeArgs.unknown`): the shim never passes
such a create through (:func:`route`). The parser never changes the argv: the shim execs the
real runtime with it unchanged.
"""

from gpuhook.model.frozen import Frozen

# flag name (without dashes) -> whether it takes a value. runc 1.1/1.2 and crun 1.x.
GLOBAL_FLAGS = {
    "root": True,
    "log": True,
    "log-format": True,
    "log-level": True,  # crun
    "criu": True,
    "rootless": True,
    "cgroup-manager": True,  # crun
    "debug": False,
    "systemd-cgroup": False,
    "help": False,
    "h": False,
    "version": False,
    "v": False,
}
_HELP = {"help": False, "h": False}
_CREATE = {
    "bundle": True,
    "b": True,
    "console-socket": True,
    "pidfd-socket": True,  # runc >= 1.2
    "pid-file": True,
    "preserve-fds": True,
    "config": True,  # crun: the spec is elsewhere (refused: see UNSUPPORTED)
    "f": True,
    "no-pivot": False,
    "no-new-keyring": False,
    **_HELP,
}
_RUN = {**_CREATE, "detach": False, "d": False, "keep": False, "no-subreaper": False}
_RESTORE = {
    **{k: True for k in ("console-socket", "image-path", "work-path", "parent-path")},
    **{k: True for k in ("manage-cgroups-mode", "bundle", "b", "pid-file", "empty-ns")},
    **{k: True for k in ("lsm-profile", "lsm-mount-context")},
    **{k: False for k in ("tcp-established", "ext-unix-sk", "shell-job", "file-locks")},
    **{k: False for k in ("detach", "d", "no-subreaper", "no-pivot", "auto-dedup")},
    **{k: False for k in ("lazy-pages", "page-server")},
    **_HELP,
}
_EXEC = {
    **{k: True for k in ("console-socket", "pidfd-socket", "cwd", "env", "e", "user", "u")},
    **{k: True for k in ("additional-gids", "g", "process", "p", "pid-file", "process-label")},
    **{k: True for k in ("apparmor", "cap", "c", "preserve-fds", "cgroup")},
    **{k: False for k in ("tty", "t", "detach", "d", "no-new-privs", "ignore-paused")},
    **_HELP,
}
COMMAND_FLAGS = {
    "create": _CREATE,
    "run": _RUN,
    "restore": _RESTORE,
    "exec": _EXEC,
    "delete": {"force": False, "f": False, **_HELP},
}
# Commands that create a container from <bundle>/config.json: each gets the create decision.
CREATE_COMMANDS = frozenset({"create", "run", "restore"})
# Flags the shim refuses on a create: crun's --config puts the spec outside the bundle.
UNSUPPORTED = frozenset({"config", "f"})
BUNDLE_FLAGS = frozenset({"bundle", "b"})
# The global flags naming runc's log file and its format, where the shim's one-line error goes.
LOG_FLAG = "log"
LOG_FORMAT_FLAG = "log-format"
LOG_FORMAT_JSON = "json"  # --log-format json: logrus JSON lines (else text)
PROCESS_FLAGS = frozenset({"process", "p"})
# gpuhook-runtime's own command, not runc's (runc has none of that name): `gpuhook-runtime hook
# VERB ...` runs one of gpuhook's OCI hooks (gpuhook.runtime.hooks; the static dispatcher runs
# the ldcache hook's plain form itself). The spec's hook args come from
# gpuhook.pipeline.inject.HOOK_COMMAND; a unit test holds the two equal.
HOOK = "hook"

# What the shim does with a call (:func:`route`).
CREATE = "create"  # decide on <bundle>/config.json, then exec the runtime
EXEC = "exec"  # add the container's granted environment to the process, then exec
DELETE = "delete"  # exec the runtime; remove the container's exec marker when it succeeds
PASS = "pass"  # noqa: S105 - exec the runtime untouched
REFUSE = "refuse"  # a create whose argv cannot be placed: refused with one line


class RuntimeArgs(Frozen):
    """What the shim needs to know of a runtime invocation.

    ``command`` is "" when the argv has no subcommand (e.g. ``--version`` or ``--help`` alone).
    ``bundle`` is as given (relative to the shim's cwd) or "" when not given. ``unknown`` is the
    first argument the grammar cannot place ("" when every argument was placed).
    """

    command: str = ""
    bundle: str = ""
    container_id: str = ""
    log_path: str = ""
    log_format: str = "text"
    root: str = ""
    version: bool = False
    process: str = ""
    unknown: str = ""

    @property
    def is_create(self) -> bool:
        return self.command in CREATE_COMMANDS


def _flag(arg: str) -> tuple[str, str | None] | None:
    """``--name=value`` -> (name, value); ``-name`` -> (name, None); not a flag -> None."""
    if arg == "-" or not arg.startswith("-"):
        return None
    body = arg[2:] if arg.startswith("--") else arg[1:]
    name, eq, value = body.partition("=")
    return (name, value if eq else None)


def _flags(
    argv: list[str] | tuple[str, ...], i: int, table: dict[str, bool]
) -> tuple[int, list[tuple[str, str | None]], str]:
    """The flags of ``table`` from ``argv[i]`` up to the first positional argument: (index of
    that argument, the flags, the first argument that does not fit the table or "")."""
    flags: list[tuple[str, str | None]] = []
    n = len(argv)
    while i < n:
        parsed = _flag(argv[i])
        if parsed is None:
            break
        name, value = parsed
        takes = table.get(name)
        if takes is None or (takes and value is None and i + 1 >= n):
            return i, flags, argv[i]
        if takes and value is None:
            value = argv[i + 1]
            i += 1
        flags.append((name, value))
        i += 1
    return i, flags, ""


def _command(
    argv: list[str] | tuple[str, ...], i: int, table: dict[str, bool], exec_like: bool
) -> tuple[list[tuple[str, str | None]], str, str]:
    """A subcommand's flags (before and, except for exec, after the id), its id, and the first
    argument that does not fit."""
    flags: list[tuple[str, str | None]] = []
    cid = ""
    n = len(argv)
    while i < n:
        i, more, unknown = _flags(argv, i, table)
        flags += more
        if unknown or i >= n:
            return flags, cid, unknown
        if cid:
            return flags, cid, argv[i]  # a second positional argument
        cid = argv[i]
        i += 1
        if exec_like:
            break
    return flags, cid, ""


def parse(argv: list[str] | tuple[str, ...]) -> RuntimeArgs:
    """Parse the arguments after argv[0]."""
    i, flags, unknown = _flags(argv, 0, GLOBAL_FLAGS)
    glob = dict(flags)
    command = argv[i] if i < len(argv) and not unknown else ""
    found: list[tuple[str, str | None]] = []
    cid = ""
    table = COMMAND_FLAGS.get(command)
    if table is not None:
        found, cid, unknown = _command(argv, i + 1, table, command == "exec")
        if command in CREATE_COMMANDS and not unknown:
            unknown = next((f"--{k}" for k, _ in found if k in UNSUPPORTED), "")
    return RuntimeArgs(
        command=command,
        bundle=_last(found, BUNDLE_FLAGS),
        container_id=cid,
        log_path=glob.get(LOG_FLAG) or "",
        log_format=glob.get(LOG_FORMAT_FLAG) or "text",
        root=glob.get("root") or "",
        version=("version" in glob or "v" in glob) and not command,
        process=_last(found, PROCESS_FLAGS),
        unknown=unknown,
    )


def _last(flags: list[tuple[str, str | None]], names: frozenset[str]) -> str:
    """The value of the last of ``names`` given (Go's flag package: the last one wins)."""
    return next((v or "" for k, v in reversed(flags) if k in names), "")


def route(args: RuntimeArgs, argv: list[str] | tuple[str, ...]) -> str:
    """What the shim does with the call (one of CREATE, EXEC, DELETE, PASS, REFUSE)."""
    if args.unknown:
        # Never a silent pass-through of a create the grammar cannot place.
        if args.is_create or (not args.command and any(a in CREATE_COMMANDS for a in argv)):
            return REFUSE
        # ...nor of an exec, which may be a GPU container's (the exec path looks for its marker).
        exec_ = args.command == EXEC or (not args.command and EXEC in argv)
        return EXEC if exec_ else PASS
    if args.is_create:
        return CREATE if args.container_id else PASS
    if args.command in (EXEC, DELETE) and args.container_id:
        return args.command
    return PASS
