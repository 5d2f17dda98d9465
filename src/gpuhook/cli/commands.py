"""The ``gpuhook`` command line (click lives in :mod:`gpuhook.cli` only). Thin: parse, call the
core, render. The command groups are one module each (``cli/cmd_*.py``); this one is the root
group and :func:`run`.

Every failure leaves through :func:`run`, which maps it with :func:`gpuhook.errors.describe`
to an exit code and one line on stderr.
"""

from __future__ import annotations

import os
import traceback

import click

from gpuhook import __version__
from gpuhook.cli import (
    cmd_check,
    cmd_inspect,
    cmd_metrics,
    cmd_mps,
    cmd_node,
    cmd_nri,
    cmd_runtime,
    cmd_setup,
)
from gpuhook.cli.base import Context
from gpuhook.config.types import ENV_DEBUG
from gpuhook.errors import describe


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="gpuhook", message="%(prog)s %(version)s")
@click.option(
    "--config",
    "config_file",
    metavar="PATH",
    help="Config file (default: $GPUHOOK_CONFIG, else /etc/gpuhook/config.yaml).",
)
@click.option("--debug", is_flag=True, help="Debug logging (same as GPUHOOK_DEBUG=1).")
@click.pass_context
def main(ctx: click.Context, config_file: str | None, debug: bool) -> None:
    """gpuhook: node-local GPU sharing runtime.

    gpuhook-runtime (the OCI runtime shim) decides for every container which GPUs it may use;
    this command explains and manages those decisions.
    """
    ctx.obj = Context(config_file, debug)


for _command in (
    cmd_setup.config_group,
    cmd_setup.inventory_group,
    cmd_setup.cdi_group,
    cmd_inspect.inspect_group,
    cmd_runtime.runtime_group,
    cmd_node.node_group,
    cmd_runtime.hook_group,
    cmd_mps.mps_group,
    cmd_metrics.metrics_group,
    cmd_inspect.gc_command,
    cmd_check.doctor_command,
    cmd_check.selftest_command,
    cmd_nri.nri_command,
):
    main.add_command(_command)


def run(argv: list[str]) -> int:
    """Run the CLI; the one place a CLI failure becomes an exit code and one line."""
    try:
        main.main(args=argv, prog_name="gpuhook", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.exceptions.Abort:
        click.echo("gpuhook: aborted", err=True)
        return 130
    except click.ClickException as exc:
        hint = ""
        if isinstance(exc, click.UsageError) and exc.ctx is not None:
            hint = f" (see: {exc.ctx.command_path} --help)"
        click.echo(f"gpuhook: {' '.join(exc.format_message().split())}{hint}", err=True)
        return 2
    except BaseException as exc:
        if isinstance(exc, SystemExit):
            return int(exc.code or 0) if not isinstance(exc.code, str) else 1
        code, message = describe(exc)
        click.echo(f"gpuhook: {message}", err=True)
        if code == 70 and os.environ.get(ENV_DEBUG):
            traceback.print_exc()
        return code
    return 0
