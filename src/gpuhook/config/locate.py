"""Where the programs are: the low-level OCI runtime gpuhook-runtime wraps (``runtime.path``, else
runc or crun on PATH and the system folders), and which gpuhook program this process runs as,
with the ``gpuhook`` beside it that the hook runs when ``hook.path`` is unset.

Host paths only: the engine's argv and environment, never anything of a container. Stdlib only
(the create path resolves the runtime when the config cache is compiled). The configuration's
lowest module: it imports nothing of gpuhook, so that :mod:`gpuhook.config.loading` (which
resolves ``runtime.path``) and :mod:`gpuhook.config.types` (``hook.path``'s default) stay below
the runtime layer that uses them (docs/architecture.md, "Layers").
"""

from __future__ import annotations

import os
import sys

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping

# Where a bare runtime name is looked up besides PATH (an engine may run with a short PATH).
SYSTEM_PATH = ("/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin")
RUNTIME_CANDIDATES = ("runc", "crun")
# The compiled gpuhook-runtime holds this byte string once, ahead of the interpreter command that
# its build writes there (gpuhook.runtime.dispatch.relocate).
DISPATCHER_MARK = b"@gpuhook-runtime interpreter@"

ENV_SELF = "GPUHOOK_SELF"  # the dispatchers' own path, set for the Python they exec
SHIM_ENTRY = "_shim_entry.py"  # the scripts the dispatchers run, in the gpuhook package folder
CLI_ENTRY = "_cli_entry.py"
SERVICE_ENTRY = "_service_entry.py"  # the runtime service's process (gpuhook runtime serve)
ENTRY_SCRIPTS = (SHIM_ENTRY, CLI_ENTRY, SERVICE_ENTRY)
PROGRAMS = ("gpuhook-runtime", "gpuhook")
FALLBACK_HOOK_PATH = "/usr/bin/gpuhook"


# --- the low-level runtime ---------------------------------------------------------------------


def resolve_runtime(configured: str) -> str:
    """Absolute path of the low-level runtime, or "" when it cannot be found."""
    names = (configured,) if configured else RUNTIME_CANDIDATES
    for name in names:
        found = which(name)
        if found and not _is_gpuhook_runtime(found):
            return found
    return ""


def which(name: str) -> str:
    """An executable ``name`` (a path, or looked up on PATH and then the system folders)."""
    if "/" in name:
        return name if os.access(name, os.X_OK) and os.path.isfile(name) else ""
    dirs = [d for d in os.environ.get("PATH", "").split(":") if d]
    dirs += [d for d in SYSTEM_PATH if d not in dirs]
    for folder in dirs:
        candidate = os.path.join(folder, name)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return ""


def _is_gpuhook_runtime(path: str) -> bool:
    """Refuse a runtime.path that points back at gpuhook-runtime (an exec loop): the compiled
    dispatcher (it holds :data:`DISPATCHER_MARK`) or a script that names it."""
    import mmap

    try:
        with open(path, "rb") as fh:
            if fh.read(2) == b"#!":
                return b"gpuhook-runtime" in fh.read(510)
            with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as data:
                return data.find(DISPATCHER_MARK) >= 0
    except (OSError, ValueError):
        return False


# --- gpuhook's own programs --------------------------------------------------------------------


def running_program(argv0: str | None = None, environ: Mapping[str, str] | None = None) -> str:
    """The gpuhook-runtime or gpuhook executable this process runs as, its links resolved; ""
    when it runs as neither (``python -m gpuhook``, a test). The .deb's and ``make build``'s
    dispatchers name themselves in ``GPUHOOK_SELF`` and run an entry script; a pip install's
    console script is ``argv[0]`` itself. Host paths only: the engine's argv and env."""
    argv0 = sys.argv[0] if argv0 is None else argv0
    env = os.environ if environ is None else environ
    if os.path.basename(argv0) in ENTRY_SCRIPTS:
        argv0 = env.get(ENV_SELF, "")
    if os.path.basename(argv0) not in PROGRAMS or not argv0:
        return ""
    return os.path.realpath(argv0)


def default_hook_path() -> tuple[str, str]:
    """hook.path when the config does not set it, and why: the ``gpuhook`` installed in the
    folder of the running gpuhook-runtime (or gpuhook), else /usr/bin/gpuhook."""
    program = running_program()
    if not program:
        return FALLBACK_HOOK_PATH, "hook.path unset and not run as gpuhook(-runtime): the default"
    return os.path.join(os.path.dirname(program), "gpuhook"), f"hook.path unset: beside {program}"
