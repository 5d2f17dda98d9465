"""Checks run by the Debian package's maintainer scripts (stdlib only, no config needed).

``python3 -I -m gpuhook.engines.maintscript default-runtime-warning`` (prerm, on removal): warn
on stderr
for every container engine config that still makes gpuhook the default runtime. Removing gpuhook
then leaves that engine with a default runtime whose executable is gone, and every container
fails to start, so the operator must hear about it; the package never edits those files itself.

``python3 -I -m gpuhook.engines.maintscript configure-hint`` (postinst): print the ``gpuhook runtime
configure`` commands, unless an engine already uses gpuhook as its default runtime.

Both always exit 0: a maintainer script must not fail over an advisory message. The engine configs
are read by :mod:`gpuhook.engines.readers` (stdlib only, the reader ``gpuhook doctor`` uses too).
"""

from __future__ import annotations

import os
import sys

from gpuhook.engines import readers

DOCKER_CONFIG = readers.DEFAULT_PATHS[readers.DOCKER]
CONTAINERD_CONFIG = readers.DEFAULT_PATHS[readers.CONTAINERD]
PODMAN_CONFIG = readers.DEFAULT_PATHS[readers.PODMAN]
CONFIGURE_COMMANDS = tuple(
    f"gpuhook runtime configure --runtime {engine} --set-as-default" for engine in readers.ENGINES
)
DEFAULT_KEY = {
    readers.DOCKER: "default-runtime",
    readers.CONTAINERD: "default_runtime_name",
    readers.PODMAN: "[engine] runtime",
}
FIX = {
    readers.DOCKER: 'remove "default-runtime" (or set it to "runc") and restart docker',
    readers.CONTAINERD: 'set default_runtime_name back to "runc" and restart containerd',
    readers.PODMAN: "remove runtime from [engine] (podman's own default applies again)",
}


class Finding:
    """An engine config that makes gpuhook its default runtime (``problem`` empty), or that could
    not be read (``problem`` says why)."""

    def __init__(self, engine: str, path: str, detail: str, problem: str = "") -> None:
        self.engine = engine
        self.path = path
        self.detail = detail
        self.problem = problem


def default_detail(reg: readers.Registration) -> str:
    """What makes gpuhook the default runtime in one engine config ("" when nothing does).

    Tolerant on purpose (a removal warning had better be shown once too often): a default
    runtime counts when its name or its executable's name says gpuhook, even where the file does
    not name the executable."""
    name = reg.default
    binary = reg.runtimes.get(name, "")
    if "gpuhook" not in name and "gpuhook" not in os.path.basename(binary):
        return ""
    key = DEFAULT_KEY[reg.engine]
    return f'{key} "{name}"' + (f" -> {binary}" if binary else "")


def findings(
    docker_config: str = DOCKER_CONFIG,
    containerd_config: str = CONTAINERD_CONFIG,
    podman_config: str = PODMAN_CONFIG,
) -> list[Finding]:
    """Each engine config (containerd's with the files its ``imports`` name, as containerd reads
    them) that makes gpuhook the default runtime, or that cannot be read."""
    out: list[Finding] = []
    for engine, path in (
        (readers.DOCKER, docker_config),
        (readers.CONTAINERD, containerd_config),
        (readers.PODMAN, podman_config),
    ):
        reg = readers.read(engine, path)
        if reg.error:
            out.append(Finding(engine, path, "", reg.error))
        elif detail := default_detail(reg):
            out.append(Finding(engine, path, detail))
    return out


def removal_warnings(found: list[Finding]) -> list[str]:
    lines = []
    for f in found:
        if f.problem:
            lines.append(
                f"gpuhook: warning: cannot parse {f.path} ({f.problem}); check by hand that "
                f"{f.engine} does not use gpuhook as its default runtime"
            )
            continue
        fix = FIX[f.engine]
        lines.append(
            f"gpuhook: WARNING: {f.path} still makes gpuhook the default runtime of {f.engine} "
            f"({f.detail}); without gpuhook every {f.engine} container will fail to start: "
            f"{fix} (this package does not edit it)"
        )
    return lines


def configure_hint(found: list[Finding]) -> list[str]:
    if any(not f.problem for f in found):
        return []
    return [
        "gpuhook: no container engine uses gpuhook yet (the package never edits their configs).",
        "gpuhook: to make it the default runtime, run one of:",
        *(f"  {command}" for command in CONFIGURE_COMMANDS),
    ]


def main(argv: list[str]) -> int:
    verb = argv[1] if len(argv) > 1 else ""
    if verb == "default-runtime-warning":
        for line in removal_warnings(findings()):
            print(line, file=sys.stderr)
    elif verb == "configure-hint":
        for line in configure_hint(findings()):
            print(line)
    else:
        print(
            "usage: python3 -m gpuhook.engines.maintscript default-runtime-warning|configure-hint",
            file=sys.stderr,
        )
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
