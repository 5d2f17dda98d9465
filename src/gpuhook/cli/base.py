"""What every ``gpuhook`` command shares: the context (the config, loaded once, and logging set
up from it), the ``--output`` option and :func:`emit`, which prints a view as JSON, YAML or a
table."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import click

from gpuhook import log
from gpuhook.cli.render import FORMATS, to_json, to_yaml
from gpuhook.config import loading as config_loading
from gpuhook.config.types import ENV_DEBUG, Config

if TYPE_CHECKING:
    from collections.abc import Callable


class Context:
    def __init__(self, config_file: str | None, debug: bool) -> None:
        self.config_file = config_file
        self.debug = debug
        self._config: Config | None = None

    def config(self, *, structlog: bool = True) -> Config:
        """The config, loaded once; logging configured from it (through structlog unless
        ``structlog`` is False: the runtime service keeps the shim's own writer)."""
        if self._config is None:
            if self.debug:
                os.environ[ENV_DEBUG] = "1"
            self._config = config_loading.load(self.config_file)
            log.configure(self._config.log_level, self._config.log_file, prefer_structlog=structlog)
            ctx = click.get_current_context(silent=True)
            log.get_logger().debug(
                "cli",
                command=ctx.command_path if ctx is not None else "gpuhook",
                config=self._config.source,
            )
        return self._config


pass_ctx = click.make_pass_decorator(Context)


def output_option(f: Callable[..., Any]) -> Callable[..., Any]:
    return click.option(
        "--output",
        "-o",
        type=click.Choice(FORMATS),
        default=None,
        help="Output format (default: table on a terminal, json otherwise).",
    )(f)


def emit(view: Any, fmt: str | None, table: Callable[[Any, bool], str]) -> None:
    tty = sys.stdout.isatty()
    fmt = fmt or ("table" if tty else "json")
    if fmt == "json":
        click.echo(to_json(view), nl=False)
    elif fmt == "yaml":
        click.echo(to_yaml(view), nl=False)
    else:
        click.echo(table(view, tty and "NO_COLOR" not in os.environ), nl=False)
