"""``gpuhook node install|uninstall``: the DaemonSet's installer."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING, Any

import click

from gpuhook.engines import readers
from gpuhook.node import bundle, install

if TYPE_CHECKING:
    from collections.abc import Callable

    pass


@click.group("node")
def node_group() -> None:
    """Put a self-contained gpuhook on a node from the DaemonSet's pod, or take it off."""


def _host_root_option(f: Callable[..., Any]) -> Callable[..., Any]:
    f = click.option(
        "--no-restart", is_flag=True, help="Do not restart the engine (it must be, to apply)."
    )(f)
    return click.option(
        "--host-root",
        required=True,
        metavar="DIR",
        type=click.Path(exists=True, file_okay=False),
        help="The node's root folder as mounted here (the DaemonSet mounts it at /host).",
    )(f)


@node_group.command("install")
@_host_root_option
@click.option(
    "--config",
    "node_config",
    metavar="FILE",
    type=click.Path(exists=True, dir_okay=False),
    help="gpuhook config for the node's /etc/gpuhook/config.yaml (validated first).",
)
@click.option(
    "--runtime",
    "engine",
    type=click.Choice((readers.CONTAINERD, readers.DOCKER)),  # those the node installer supports
    default=readers.CONTAINERD,
    show_default=True,
    help="The engine to register gpuhook-runtime with.",
)
@click.option(
    "--ready-file",
    default="/run/gpuhook-node/ready",
    show_default=True,
    help="Written (in this container) once installed; the readinessProbe tests it.",
)
@click.option("--no-wait", is_flag=True, help="Install and exit (no uninstall on SIGTERM).")
@click.option(
    "--metrics-listen",
    metavar="HOST:PORT",
    default="",
    help="While installed, run the installed gpuhook metrics serve (chrooted into the host "
    "root) on this address of the pod (docs/node-view.md); none by default.",
)
def node_install(
    host_root: str,
    no_restart: bool,
    node_config: str | None,
    engine: str,
    ready_file: str,
    no_wait: bool,
    metrics_listen: str,
) -> None:
    """Install gpuhook on the node, then wait and uninstall it on SIGTERM.

    Copies the runtime (this image's interpreter, libraries and loader) to /opt/gpuhook, writes
    /etc/gpuhook/config.yaml, refreshes the inventory, registers /opt/gpuhook/bin/gpuhook-runtime
    as the engine's default runtime and restarts the engine through the host's PID 1.
    """

    host_root = os.path.abspath(host_root)
    if no_wait:
        source = bundle.image_source()
        for line in install.install(host_root, node_config, engine, not no_restart, source):
            click.echo(line)
        return
    install.serve(
        host_root, node_config, engine, not no_restart, ready_file, _echo_flush, metrics_listen
    )


@node_group.command("uninstall")
@_host_root_option
def node_uninstall(host_root: str, no_restart: bool) -> None:
    """Unregister gpuhook-runtime, restart the engine, remove what `node install` put there."""

    for line in install.uninstall(os.path.abspath(host_root), not no_restart):
        click.echo(line)


def _echo_flush(line: str) -> None:
    click.echo(line)
    sys.stdout.flush()
