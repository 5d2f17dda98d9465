"""``gpuhook mps start|stop|status``: the CUDA MPS control daemons of the shared GPUs."""

from __future__ import annotations

from typing import Any

import click

from gpuhook import log
from gpuhook.cli import tables
from gpuhook.cli.base import Context, emit, output_option, pass_ctx
from gpuhook.errors import GpuhookError
from gpuhook.mps import daemons
from gpuhook.runtime import decide


@click.group("mps")
def mps_group() -> None:
    """CUDA MPS control daemons of the MPS-shared GPUs (mps.* in the config).

    GPU arguments are GPU indices, GPU UUIDs or share-group names; none means every group.
    """


def _mps_daemons(obj: Context, gpus: tuple[str, ...]) -> list[Any]:
    config = obj.config()
    return daemons.daemons(config, decide.inventory(config), gpus)


def _mps_each(obj: Context, gpus: tuple[str, ...], action: str) -> None:
    """Run start or stop on every named group; the first failure is raised after the others ran."""

    failures: list[GpuhookError] = []
    for daemon in _mps_daemons(obj, gpus):
        try:
            result = daemon.start() if action == "start" else daemon.stop()
        except GpuhookError as exc:
            log.get_logger().error(
                "mps " + action + " failed", group=daemon.group.name, error=str(exc)
            )
            failures.append(exc)
            continue
        log.get_logger().info("mps " + action, **result)
        pid = f" (pid {result['pid']})" if result["pid"] else ""
        mode = f", compute mode {result['compute_mode']}" if result.get("compute_mode") else ""
        click.echo(f"{daemon.label}: {result['state']}{pid}, pipe {daemon.pipe_dir}{mode}")
        for warning in result.get("warnings", []):
            click.echo(f"gpuhook: warning: {warning}", err=True)
    if failures:
        raise failures[0]


@mps_group.command("start")
@click.argument("gpus", nargs=-1, metavar="[GPU|GROUP]...")
@pass_ctx
def mps_start(obj: Context, gpus: tuple[str, ...]) -> None:
    """Start the control daemons (idempotent) and set their defaults from the share."""
    _mps_each(obj, gpus, "start")


@mps_group.command("stop")
@click.argument("gpus", nargs=-1, metavar="[GPU|GROUP]...")
@pass_ctx
def mps_stop(obj: Context, gpus: tuple[str, ...]) -> None:
    """Stop the control daemons (quit, then signals): afterwards none of them runs."""
    _mps_each(obj, gpus, "stop")


@mps_group.command("status")
@click.argument("gpus", nargs=-1, metavar="[GPU|GROUP]...")
@output_option
@pass_ctx
def mps_status(obj: Context, gpus: tuple[str, ...], output: str | None) -> None:
    """Per group: daemon running or down (pid), pipe dir, defaults, servers and their clients."""

    config = obj.config()
    view = {
        "config": config.source,
        "root": config.mps.root,
        "groups": [d.status() for d in _mps_daemons(obj, gpus)],
    }
    emit(view, output, tables.mps_table)
