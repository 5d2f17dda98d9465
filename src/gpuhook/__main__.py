"""``gpuhook`` / ``python -m gpuhook``: dispatch ``hook`` (stdlib only) or the click CLI."""

from __future__ import annotations

import sys


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    if len(argv) > 1 and argv[1] == "hook":
        from gpuhook.runtime.hooks import main as hook_main

        return hook_main(argv[2:])
    from gpuhook._site import enable_site_packages

    enable_site_packages()
    from gpuhook.cli.commands import run

    return run(argv[1:])


if __name__ == "__main__":
    sys.exit(main())
