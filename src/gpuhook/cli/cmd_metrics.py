"""``gpuhook metrics serve``: the node's Prometheus metrics over HTTP."""

from __future__ import annotations

import click

from gpuhook.cli.base import Context, pass_ctx
from gpuhook.nodeview import serve


@click.group("metrics")
def metrics_group() -> None:
    """Prometheus metrics of the node (docs/node-view.md)."""


@metrics_group.command("serve")
@click.option(
    "--listen",
    metavar="HOST:PORT",
    envvar="GPUHOOK_METRICS_LISTEN",
    default="127.0.0.1:9479",
    show_default=True,
    help="Where to serve /metrics ([V6]:PORT for IPv6, :PORT for every address); "
    "environment: GPUHOOK_METRICS_LISTEN.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.1),
    default=5.0,
    show_default=True,
    metavar="SECONDS",
    help="How often to look for new decision records (each scrape looks too).",
)
@pass_ctx
def metrics_serve(obj: Context, listen: str, interval: float) -> None:
    """Serve the node's metrics in Prometheus' format until SIGTERM.

    Container creates by decision and channel, refusals by kind and the create decision's
    latency (service or Python path) come from the decision records each create writes; GPU
    and pod processes and memory, unexpected GPU users, MPS reservations, the inventory's age
    and the runtime service's health from one look at the node per scrape (NVML, /proc, the
    records). A process of its own: nothing of it runs on a container's create path.
    """
    config = obj.config()
    serve.serve(config, listen, interval, click.echo)
