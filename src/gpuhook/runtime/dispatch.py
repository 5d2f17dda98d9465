"""Render the installed POSIX sh dispatchers (``packaging/*.in``) from gpuhook's own tables.

A build step (``make build``, the Debian package's ``debian/rules``)::

    PYTHONPATH=src python3 -m gpuhook.runtime.dispatch TEMPLATE OUTPUT PYTHON PKGDIR

Each ``@NAME@`` of a template is replaced by the interpreter and package folder given, or by
text made from the one table that owns the rule: the runc argv grammar
(:mod:`gpuhook.runtime.runc_argv`), the GPU markers (:mod:`gpuhook.markers`), the cache trust
rule and the pointer's place (:mod:`gpuhook.config`), the ``hook update-ldcache`` bounds
(:mod:`gpuhook.runtime.hooks`). A template naming anything else fails the build.
"""

from __future__ import annotations

import sys

from gpuhook import config, markers
from gpuhook.records import execenv
from gpuhook.runtime import hooks, runc_argv


def _patterns(pairs: list[str]) -> str:
    """A sh ``case`` pattern list; the names are [a-z-] only, so no quoting is needed."""
    bad = [p for p in pairs if not p.replace("-", "").replace(":", "").isalpha()]
    if bad:
        raise ValueError(f"not a plain flag or command name: {bad}")
    return "|".join(pairs)


def _flag_patterns(takes_value: bool) -> str:
    scoped = [("g", runc_argv.GLOBAL_FLAGS), *list(runc_argv.COMMAND_FLAGS.items())]
    return _patterns(
        [
            f"{scope}:{name}"
            for scope, table in scoped
            for name, value in table.items()
            if value == takes_value and not _to_python(scope, name)
        ]
    )


def _to_python(scope: str, name: str) -> bool:
    """Flags that always send the call to Python: --version, and the refused create flags."""
    if scope == "g":
        return name in ("version", "v")
    return scope in runc_argv.CREATE_COMMANDS and name in runc_argv.UNSUPPORTED


def _python_flags() -> str:
    scoped = [("g", runc_argv.GLOBAL_FLAGS), *list(runc_argv.COMMAND_FLAGS.items())]
    return _patterns([f"{s}:{n}" for s, table in scoped for n in table if _to_python(s, n)])


def _marker_args() -> str:
    words = [*markers.PRECHECK_MARKERS, markers.UNICODE_ESCAPE]
    if any(b"'" in w or not w.isascii() for w in words):
        raise ValueError("a GPU marker that sh cannot quote")
    return " ".join(f"-e '{w.decode()}'" for w in words)


def substitutions(python: str, pkgdir: str) -> dict[str, str]:
    creates = sorted(runc_argv.CREATE_COMMANDS)
    return {
        "PYTHON": python,
        "PKGDIR": pkgdir,
        "DEFAULT_CONFIG": config.DEFAULT_PATH,
        "POINTER": config.CACHE_ROOT + "$c/" + config.POINTER_NAME,
        "POINTER_MODE": f"{config.POINTER_MODE:04o}",
        "EXEC_ENV_DIR": execenv.DIR,
        "CREATES": _patterns(creates),
        "PARSED": _patterns(sorted(runc_argv.COMMAND_FLAGS)),
        "BUNDLE_FLAGS": _patterns([f"{c}:{f}" for c in creates for f in runc_argv.BUNDLE_FLAGS]),
        "VALUE_FLAGS": _flag_patterns(True),
        "BOOL_FLAGS": _flag_patterns(False),
        "PYTHON_FLAGS": _python_flags(),
        "MARKERS": _marker_args(),
        "LDCACHE_FLAGS": _patterns(list(hooks.UPDATE_LDCACHE_FLAGS)),
        "LDCONFIG_ENV": " ".join(f"{k}={v}" for k, v in hooks.SAFE_ENV.items()),
        "LDCONFIG_TIMEOUT": str(int(hooks.LDCONFIG_TIMEOUT_S)),
        "LDCONFIG_TIMEOUT_MAX": str(hooks.LDCONFIG_TIMEOUT_MAX_S),
        "LDCONFIG_HEAP_KB": str(hooks.LDCONFIG_DATA_LIMIT >> 10),
        "LDCONFIG_CPU_S": str(hooks.LDCONFIG_CPU_S),
    }


def render(template: str, python: str, pkgdir: str) -> str:
    out = template
    for name, value in substitutions(python, pkgdir).items():
        out = out.replace(f"@{name}@", value)
    left = [part for part in out.split("@")[1::2] if part.isupper() and part.isidentifier()]
    if left:
        raise ValueError(f"unknown template names: {', '.join(sorted(set(left)))}")
    return out


def main(argv: list[str]) -> int:
    if len(argv) != 4:
        sys.stderr.write(
            "usage: python3 -m gpuhook.runtime.dispatch TEMPLATE OUTPUT PYTHON PKGDIR\n"
        )
        return 2
    template, output, python, pkgdir = argv
    with open(template, encoding="utf-8") as fh:
        text = render(fh.read(), python, pkgdir)
    with open(output + ".tmp", "w", encoding="utf-8") as fh:
        fh.write(text)
    import os

    os.chmod(output + ".tmp", 0o755)  # noqa: S103 - an executable for everyone
    os.replace(output + ".tmp", output)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
