"""``gpuhook nri``: run gpuhook as an NRI plugin (containerd 2.x, CRI-O) until stopped."""

from __future__ import annotations

import signal
import sys
from typing import TYPE_CHECKING, Any

import click

from gpuhook import _fastjson, log
from gpuhook.cli.base import Context, pass_ctx
from gpuhook.config import loading as config_loading
from gpuhook.nri import defaults, plugin

if TYPE_CHECKING:
    from gpuhook.config.types import Config


@click.command("nri")
@click.option(
    "--socket",
    "socket_path",
    metavar="PATH",
    default=defaults.SOCKET,
    show_default=True,
    help="The engine's NRI socket.",
)
@click.option(
    "--index",
    metavar="NN",
    default=defaults.INDEX,
    show_default=True,
    help="The plugin's two-digit NRI index (plugins are called in index order).",
)
@pass_ctx
def nri_command(obj: Context, socket_path: str, index: str) -> None:
    """Run gpuhook as an NRI plugin: every container the engine creates is decided by the same
    core as gpuhook-runtime's and adjusted (devices, driver files, env, the ld.so.cache hook),
    or its create is refused with one line. Reconnects when the engine restarts. No engine
    runtime registration is needed; see docs/nri.md for the fail-closed configuration."""
    try:
        defaults.check_index(index)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--index") from None
    try:
        obj.config()  # logging as configured; a broken config is reported per create
    except Exception as exc:
        _say("config not loaded", error=str(exc))

    def load() -> Config:
        return config_loading.load(obj.config_file)

    stopping: list[int] = []
    runner = plugin.Plugin(socket_path, index, load_config=load, log=_say)

    def stop(signum: int, _frame: Any) -> None:
        stopping.append(signum)
        runner.close()

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
    _say("nri plugin starting", socket=socket_path, plugin=f"{index}-{defaults.NAME}")
    try:
        runner.run_forever(stop=lambda: bool(stopping))
    finally:
        runner.retire()
    _say("nri plugin stopped")


def _say(event: str, **fields: Any) -> None:
    """One line on stderr (the journal's) and the event in gpuhook's log."""
    shown = " ".join(f"{k}={_fastjson.dumps(v)}" for k, v in fields.items() if v is not None)
    sys.stderr.write(f"gpuhook nri: {event}{' ' + shown if shown else ''}\n")
    sys.stderr.flush()
    log.get_logger(component="nri").info(event, **fields)
