"""Parse a runc command line (pure). gpuhook-runtime is argv-compatible with runc.

runc (urfave/cli on Go's flag package) accepts ``--flag value``, ``--flag=value`` and the
single-dash forms ``-flag value`` / ``-flag=value``. Global flags come before the subcommand;
the subcommand's own flags come before its positional arguments (the container id).
The parser never changes the argv: the shim execs the real runtime with it unchanged.
"""

from gpuhook.model.frozen import Frozen, _init

# No ``from __future__ import annotations``: the shim's fast path imports this module, and every
# annotation here can be evaluated at runtime.

# runc's global flags: those that take a value, and boolean ones.
GLOBAL_VALUE_FLAGS = frozenset({"root", "log", "log-format", "criu", "rootless"})
GLOBAL_BOOL_FLAGS = frozenset({"debug", "systemd-cgroup", "help", "h", "version", "v"})

# Flags of `create` and `run` that take a value (everything else there is boolean).
CREATE_VALUE_FLAGS = frozenset({"bundle", "b", "console-socket", "pid-file", "preserve-fds"})
CREATE_BOOL_FLAGS = frozenset(
    {
        "no-pivot",
        "no-new-keyring",
        "detach",
        "d",
        "keep",
        "no-subreaper",
        "help",
        "h",
    }
)

CREATE_COMMANDS = frozenset({"create", "run"})


class RuntimeArgs(Frozen):
    """What the shim needs to know of a runtime invocation.

    ``command`` is "" when the argv has no subcommand (e.g. ``--version`` or ``--help`` alone).
    ``bundle`` is as given (relative to the shim's cwd) or "" when not given.
    """

    __slots__ = (
        "bundle",
        "command",
        "container_id",
        "global_flags",
        "log_format",
        "log_path",
        "root",
        "version",
    )
    global_flags: tuple[tuple[str, str | None], ...]
    command: str
    bundle: str
    container_id: str
    log_path: str
    log_format: str
    root: str
    version: bool

    def __init__(
        self,
        global_flags: tuple[tuple[str, str | None], ...] = (),
        command: str = "",
        bundle: str = "",
        container_id: str = "",
        log_path: str = "",
        log_format: str = "text",
        root: str = "",
        version: bool = False,
    ) -> None:
        _init(
            self,
            global_flags=tuple(global_flags),
            command=command,
            bundle=bundle,
            container_id=container_id,
            log_path=log_path,
            log_format=log_format,
            root=root,
            version=version,
        )

    @property
    def is_create(self) -> bool:
        return self.command in CREATE_COMMANDS


def _flag_name(arg: str) -> tuple[str, str | None] | None:
    """``--name=value`` -> (name, value); ``-name`` -> (name, None); not a flag -> None."""
    if arg in ("-", "--") or not arg.startswith("-"):
        return None
    body = arg[2:] if arg.startswith("--") else arg[1:]
    name, eq, value = body.partition("=")
    return (name, value if eq else None)


def parse(argv: list[str] | tuple[str, ...]) -> RuntimeArgs:
    """Parse the arguments after argv[0]. Unknown flags are kept and treated as boolean."""
    flags: list[tuple[str, str | None]] = []
    i = 0
    n = len(argv)
    version = False
    while i < n:
        arg = argv[i]
        if arg == "--":
            i += 1
            break
        parsed = _flag_name(arg)
        if parsed is None:
            break
        name, value = parsed
        if value is None and name in GLOBAL_VALUE_FLAGS and i + 1 < n:
            value = argv[i + 1]
            i += 1
        if name in ("version", "v"):
            version = True
        flags.append((name, value))
        i += 1
    glob = dict(flags)
    command = argv[i] if i < n else ""
    bundle = ""
    container_id = ""
    if command in CREATE_COMMANDS:
        j = i + 1
        while j < n:
            arg = argv[j]
            if arg == "--":
                j += 1
                break
            parsed = _flag_name(arg)
            if parsed is None:
                break
            name, value = parsed
            if value is None and name in CREATE_VALUE_FLAGS and j + 1 < n:
                value = argv[j + 1]
                j += 1
            if name in ("bundle", "b") and value is not None:
                bundle = value
            j += 1
        if j < n:
            container_id = argv[j]
    return RuntimeArgs(
        global_flags=tuple(flags),
        command=command,
        bundle=bundle,
        container_id=container_id,
        log_path=glob.get("log") or "",
        log_format=glob.get("log-format") or "text",
        root=glob.get("root") or "",
        version=version and not command,
    )
