"""Build the installed dispatchers (``packaging/*.in``) from gpuhook's own tables.

A build step (``make build``, the Debian package's ``debian/rules``)::

    PYTHONPATH=src python3 -m gpuhook.runtime.dispatch TEMPLATE OUTPUT PYTHON PKGDIR

Each ``@NAME@`` of a template is replaced by text made from the one table that owns the rule:
the runc argv grammar (:mod:`gpuhook.runtime.runc_argv`), the GPU markers
(:mod:`gpuhook.markers`), the cache trust rule and the pointer's place
(:mod:`gpuhook.config.cache`), the config's file and variables (:mod:`gpuhook.config.types`), the
entry scripts and the relocation mark (:mod:`gpuhook.config.locate`), the exec-env markers'
folder, the runtime service's wire constants (:mod:`gpuhook.runtime.wire`), exit codes
(:mod:`gpuhook.errors`) and the ``hook update-ldcache`` steps and bounds
(:mod:`gpuhook.runtime.hooks`, :mod:`gpuhook.runtime.ldmerge`, :mod:`gpuhook.inventory.ldcache`).
A template naming anything else fails the build.

``gpuhook.in`` (the CLI dispatcher) is POSIX sh; the interpreter and package folder are written
into it. ``gpuhook-runtime.c.in`` is C, with ``gpuhook-ldcache.c.in`` (the ldcache hook the
dispatcher runs itself) rendered into it, compiled here (``$CC``, default ``cc``, statically
linked: the node installer copies it to hosts with any C library); its interpreter command is
not compiled in but written into a marked region of the binary by :func:`relocate`, which
``gpuhook node install`` uses again for its copy.
"""

from __future__ import annotations

import os
import sys

from gpuhook import errors, markers
from gpuhook.config import cache as config_cache
from gpuhook.config import locate
from gpuhook.config.types import DEFAULT_PATH, ENV_CACHE_DIR, ENV_CONFIG, ENV_DEBUG, RECORDS_DIR
from gpuhook.fsutil import TMP_MARK, atomic_write
from gpuhook.inventory import ldcache
from gpuhook.pipeline import inject
from gpuhook.records import execenv, ids
from gpuhook.runtime import hooks, ldmerge, ldrun, ocispec, runc_argv, wire

# The size of the compiled dispatcher's region that holds the interpreter command after
# locate.DISPATCHER_MARK (see relocate).
RELOCATION_SIZE = 4096
# The ldcache hook's C, rendered into gpuhook-runtime.c.in where @LDCACHE_HOOK@ stands (the
# source tree's packaging folder: the dispatcher is compiled at build time only).
_SRC_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
HOOK_TEMPLATE = os.path.join(os.path.dirname(_SRC_ROOT), "packaging", "gpuhook-ldcache.c.in")


def _names(pairs: list[str]) -> list[str]:
    """Flag and command names are [a-z-] only (scoped as ``scope:name``)."""
    bad = [p for p in pairs if not p.replace("-", "").replace(":", "").isalpha()]
    if bad:
        raise ValueError(f"not a plain flag or command name: {bad}")
    return pairs


def _scoped() -> list[tuple[str, dict[str, bool]]]:
    return [("g", runc_argv.GLOBAL_FLAGS), *list(runc_argv.COMMAND_FLAGS.items())]


def _to_python(scope: str, name: str) -> bool:
    """Flags that always send the call to Python: --version, and the refused create flags."""
    if scope == "g":
        return name in ("version", "v")
    return scope in runc_argv.CREATE_COMMANDS and name in runc_argv.UNSUPPORTED


def tables() -> dict[str, list[str]]:
    """The argv grammar as the dispatcher reads it: scoped flag names ``scope:name``."""
    creates = sorted(runc_argv.CREATE_COMMANDS)
    flags = [(s, n, v) for s, table in _scoped() for n, v in table.items()]
    return {
        "CREATES": _names(creates),
        "PARSED": _names(sorted(runc_argv.COMMAND_FLAGS)),
        "BUNDLE_FLAGS": _names([f"{c}:{f}" for c in creates for f in runc_argv.BUNDLE_FLAGS]),
        "VALUE_FLAGS": _names([f"{s}:{n}" for s, n, v in flags if v and not _to_python(s, n)]),
        "BOOL_FLAGS": _names([f"{s}:{n}" for s, n, v in flags if not v and not _to_python(s, n)]),
        "PYTHON_FLAGS": _names([f"{s}:{n}" for s, n, _ in flags if _to_python(s, n)]),
    }


def substitutions(python: str, pkgdir: str) -> dict[str, str]:
    """For the sh template (gpuhook.in)."""
    return {
        "PYTHON": python,
        "PKGDIR": pkgdir,
        "CLI_ENTRY": locate.CLI_ENTRY,
    }


def _c_string(value: str | bytes) -> str:
    raw = value.encode() if isinstance(value, str) else value
    if not raw.isascii() or any(b < 0x20 for b in raw):
        raise ValueError(f"not a plain ASCII string for C: {raw!r}")
    return '"' + raw.decode().replace("\\", "\\\\").replace('"', '\\"') + '"'


def _c_list(names: list[str]) -> str:
    return ", ".join(_c_string(n) for n in names)


def _c_char(tag: bytes) -> str:
    if len(tag) != 1 or not tag.isalpha():
        raise ValueError(f"not a one-letter reply tag: {tag!r}")
    return f"'{tag.decode()}'"


def c_substitutions() -> dict[str, str]:
    """For the C template (gpuhook-runtime.c.in)."""
    return {
        **{name: _c_list(names) for name, names in tables().items()},
        "MARKERS": ", ".join(
            _c_string(m) for m in (*markers.PRECHECK_MARKERS, markers.UNICODE_ESCAPE)
        ),
        "DEFAULT_CONFIG": _c_string(DEFAULT_PATH),
        "CACHE_ROOT": _c_string(config_cache.CACHE_ROOT),
        "POINTER_NAME": _c_string(config_cache.POINTER_NAME),
        "UNTRUSTED_MODE": f"0{config_cache.UNTRUSTED_MODE:o}",
        "EXEC_ENV_DIR": _c_string(execenv.DIR),
        "RECORDS_DIR": _c_string(RECORDS_DIR),
        "RECORD_SUFFIX": _c_string(ids.SUFFIX),
        "TMP_MARK": _c_string(TMP_MARK),
        "MAX_SAVED_SPEC": str(wire.MAX_SAVED_SPEC),
        "LOG_FLAG": _c_string(f"g:{runc_argv.LOG_FLAG}"),
        "LOG_FORMAT_FLAG": _c_string(f"g:{runc_argv.LOG_FORMAT_FLAG}"),
        "PROTOCOL": _c_string(wire.PROTOCOL),
        "ENV_CONFIG": _c_string(ENV_CONFIG),
        "ENV_CACHE_DIR": _c_string(ENV_CACHE_DIR),
        "ENV_DEBUG": _c_string(ENV_DEBUG),
        "ENV_SELF": _c_string(locate.ENV_SELF),
        "SPEC_NAME": _c_string(ocispec.CONFIG_NAME),
        "CMD_EXEC": _c_string(runc_argv.EXEC),
        "CMD_DELETE": _c_string(runc_argv.DELETE),
        "LOG_FORMAT_JSON": _c_string(runc_argv.LOG_FORMAT_JSON),
        "ID_CHARS": _c_string("".join(sorted(ids.ID_CHARS))),
        "MAX_ID": str(ids.MAX_LEN),
        "REPLY_EXEC": _c_char(wire.EXEC),
        "REPLY_EXIT": _c_char(wire.EXIT),
        "REPLY_DECLINE": _c_char(wire.DECLINE),
        "MAX_REQUEST": str(wire.MAX_REQUEST),
        "EXIT_FAILURE": str(errors.GpuhookError.exit_code),
        "EXIT_NO_RUNTIME": str(errors.RuntimeNotFoundError.exit_code),
        "RELOCATION_SIZE": str(RELOCATION_SIZE),
        "RELOCATION_MARK": _c_string(locate.DISPATCHER_MARK),
        "CMD_HOOK": _c_string(runc_argv.HOOK),
    }


def hook_substitutions() -> dict[str, str]:
    """For the ldcache hook's C (gpuhook-ldcache.c.in)."""
    return {
        "LDCACHE_FLAGS": _c_list(_names(list(hooks.UPDATE_LDCACHE_FLAGS))),
        "LDCONFIG_ENV": _c_list([f"{k}={v}" for k, v in ldrun.SAFE_ENV.items()]),
        "LDCACHE_FOLDER_FLAGS": _c_list(list(ldmerge.FOLDER_FLAGS)),
        "LDCACHE_VERB": _c_string(inject.LDCACHE_VERB),
        "LDCACHE_OUTCOME_FLAG": _c_string(hooks.OUTCOME_FLAG),
        "LDCACHE_DIR": _c_string(ldmerge.CACHE_DIR),
        "LDCACHE_NAME": _c_string(ldmerge.CACHE_NAME),
        "LDCACHE_TEMP": _c_string(ldmerge.CACHE_TEMP),
        "LDCACHE_FOLDER_CACHE": _c_string(ldmerge.FOLDER_CACHE),
        "LDCACHE_NEW_MAGIC": _c_string(ldcache.NEW_MAGIC + ldcache.NEW_VERSION),
        "LDCACHE_OLD_MAGIC": _c_string(ldcache.OLD_MAGIC),
        "LDCONFIG_TIMEOUT": str(int(ldrun.LDCONFIG_TIMEOUT_S)),
        "LDCONFIG_TIMEOUT_MAX": str(ldrun.LDCONFIG_TIMEOUT_MAX_S),
        "LDCONFIG_DATA_LIMIT": str(ldrun.LDCONFIG_DATA_LIMIT),
        "LDCONFIG_CPU_S": str(ldrun.LDCONFIG_CPU_S),
        "LDCACHE_MAX_BYTES": str(ldmerge.MAX_CACHE_BYTES),
        "LDCACHE_HWCAP_EXTENSION": str(ldcache.HWCAP_EXTENSION),
    }


def _fill(template: str, values: dict[str, str]) -> str:
    out = template
    for name, value in values.items():
        out = out.replace(f"@{name}@", value)
    left = [part for part in out.split("@")[1::2] if part.isupper() and part.isidentifier()]
    if left:
        raise ValueError(f"unknown template names: {', '.join(sorted(set(left)))}")
    return out


def render(template: str, python: str, pkgdir: str) -> str:
    """A sh template with its interpreter and package folder."""
    return _fill(template, substitutions(python, pkgdir))


def render_c(template: str, hook_template: str | None = None) -> str:
    """The C template's source, the ldcache hook's rendered into it (``hook_template``: its text,
    by default :data:`HOOK_TEMPLATE`'s). No interpreter in it: see :func:`relocate`."""
    if hook_template is None:
        with open(HOOK_TEMPLATE, encoding="utf-8") as fh:
            hook_template = fh.read()
    hook = _fill(hook_template, hook_substitutions())
    return _fill(template, {**c_substitutions(), "LDCACHE_HOOK": hook})


def python_command(python: str, pkgdir: str) -> list[str]:
    """The command the dispatcher starts the shim with (argv[1:] follow)."""
    return [*python.split(" "), "-I", "-S", f"{pkgdir}/gpuhook/{locate.SHIM_ENTRY}"]


def relocate(binary: bytes, command: list[str]) -> bytes:
    """The compiled dispatcher with ``command`` as its interpreter command (NUL-terminated words
    and an empty word after the mark, the rest of the region zero)."""
    head = locate.DISPATCHER_MARK + b"\0"
    at = binary.find(head)
    if at < 0 or binary.find(head, at + 1) >= 0:
        raise ValueError("not a gpuhook-runtime dispatcher (its interpreter region is not there)")
    if not command or any(not w or "\0" in w for w in command):
        raise ValueError(f"not an interpreter command: {command!r}")
    words = b"".join(w.encode() + b"\0" for w in command) + b"\0"
    room = RELOCATION_SIZE - len(head)
    if len(words) > room:
        raise ValueError(f"interpreter command longer than {room} bytes: {command!r}")
    start = at + len(head)
    return binary[:start] + words.ljust(room, b"\0") + binary[start + room :]


def command_of(binary: bytes) -> list[str]:
    """The interpreter command written into a compiled dispatcher ([] when none)."""
    head = locate.DISPATCHER_MARK + b"\0"
    at = binary.find(head)
    if at < 0:
        raise ValueError("not a gpuhook-runtime dispatcher (its interpreter region is not there)")
    region = binary[at + len(head) : at + RELOCATION_SIZE]
    return [w.decode() for w in region.split(b"\0\0", 1)[0].split(b"\0") if w]


def compile_c(source: str, output: str, command: list[str]) -> None:
    """Compile the rendered C dispatcher and write it, relocated, to ``output`` (atomically)."""
    import subprocess
    import tempfile

    cc = os.environ.get("CC", "cc")
    with tempfile.TemporaryDirectory() as tmp:
        src, binary = os.path.join(tmp, "gpuhook-runtime.c"), os.path.join(tmp, "out")
        with open(src, "w", encoding="utf-8") as fh:
            fh.write(source)
        flags = ["-O2", "-static", "-Wall", "-Wextra", "-Werror", "-o", binary, src]
        done = subprocess.run([cc, *flags], capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{cc} failed:\n{done.stderr}")
        with open(binary, "rb") as fh:
            data = relocate(fh.read(), command)
    atomic_write(output, data, 0o755, fsync=False)


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        sys.stderr.write(
            "usage: python3 -m gpuhook.runtime.dispatch TEMPLATE OUTPUT PYTHON PKGDIR\n"
        )
        return 2
    template, output, python, pkgdir = argv
    with open(template, encoding="utf-8") as fh:
        text = fh.read()
    if template.endswith(".c.in"):
        compile_c(render_c(text), output, python_command(python, pkgdir))
    else:
        atomic_write(output, render(text, python, pkgdir).encode(), 0o755, fsync=False)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
