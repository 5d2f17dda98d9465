"""``gpuhook runtime configure|unconfigure|serve`` (engine registration, the runtime service) and
``gpuhook hook`` (the OCI hook, for the runtime only)."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any

import click

from gpuhook.cli.base import Context, pass_ctx
from gpuhook.config import locate
from gpuhook.engines import configure, readers
from gpuhook.engines.common import DEFAULT_NAME, DEFAULT_RUNTIME_PATH
from gpuhook.errors import UsageError
from gpuhook.runtime import service
from gpuhook.runtime.hooks import main as hook_main

if TYPE_CHECKING:
    from collections.abc import Callable

    pass


@click.group("runtime")
def runtime_group() -> None:
    """Register gpuhook-runtime with docker, containerd or podman; run the runtime service."""


def _engine_options(f: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(
        (
            click.option(
                "--runtime",
                "engine",
                type=click.Choice(readers.ENGINES),
                required=True,
                help="The engine whose config to edit.",
            ),
            click.option(
                "--config",
                "engine_config",
                metavar="PATH",
                help=f"The engine's config (default: {', '.join(readers.DEFAULT_PATHS.values())}).",
            ),
            click.option(
                "--runtime-name",
                default=DEFAULT_NAME,
                show_default=True,
                help="The runtime's name.",
            ),
            click.option(
                "--drop-in",
                metavar="PATH",
                help="containerd: keep gpuhook's runtime in this file, imported by --config.",
            ),
            click.option(
                "--containerd",
                "containerd_bin",
                metavar="PATH",
                help="containerd: the containerd whose `config dump` reads the merged config "
                "before the edit and checks it after (default: containerd on PATH).",
            ),
            click.option("--dry-run", is_flag=True, help="Print the diff; write nothing."),
        )
    ):
        f = option(f)
    return f


@runtime_group.command("configure")
@_engine_options
@click.option(
    "--set-as-default",
    is_flag=True,
    help="Make gpuhook the default runtime (it then sees every container).",
)
@click.option(
    "--runtime-path",
    default=DEFAULT_RUNTIME_PATH,
    show_default=True,
    help="The gpuhook-runtime executable the engine runs.",
)
def runtime_configure(
    engine: str,
    engine_config: str | None,
    runtime_name: str,
    drop_in: str | None,
    containerd_bin: str | None,
    dry_run: bool,
    set_as_default: bool,
    runtime_path: str,
) -> None:
    """Register gpuhook-runtime in docker's daemon.json, containerd's config.toml or podman's
    containers.conf."""

    plan = configure.plan(
        engine,
        configure.CONFIGURE,
        config_path=engine_config,
        name=runtime_name,
        runtime_path=runtime_path,
        set_default=set_as_default,
        drop_in=drop_in,
        containerd=containerd_bin,
    )
    if not locate.which(runtime_path):  # an absolute path (configure.plan checked)
        click.echo(
            f"warning: {runtime_path} is not an executable file here; {engine} cannot start "
            f"containers through runtime {runtime_name} until it is",
            err=True,
        )
    _report_plan(plan, dry_run, "is already registered")


@runtime_group.command("unconfigure")
@_engine_options
def runtime_unconfigure(
    engine: str,
    engine_config: str | None,
    runtime_name: str,
    drop_in: str | None,
    containerd_bin: str | None,
    dry_run: bool,
) -> None:
    """Remove what `runtime configure` added; runc becomes the default again if gpuhook was."""

    plan = configure.plan(
        engine,
        configure.UNCONFIGURE,
        config_path=engine_config,
        name=runtime_name,
        drop_in=drop_in,
        containerd=containerd_bin,
    )
    _report_plan(plan, dry_run, "is not registered")


def _report_plan(plan: Any, dry_run: bool, unchanged: str) -> None:
    main_path = plan.changes[0].path
    restart = f"systemctl restart {plan.service}" if plan.service else ""
    for note in plan.notes:
        click.echo(f"{plan.engine}: {note}")
    if not plan.changed:
        click.echo(f"{main_path}: gpuhook {unchanged}; nothing changed, nothing written")
        return
    if dry_run:
        click.echo(configure.render_diff(plan), nl=False)
        needs = f" (applying it needs: {restart})" if restart else ""
        click.echo(f"dry run: nothing written{needs}")
        return
    for line in configure.apply(plan):
        click.echo(line)
    if restart:
        click.echo(f"restart {plan.service} to apply: {restart}")
    else:
        click.echo(f"{plan.engine} reads {main_path} on every command: nothing to restart")


@runtime_group.command("serve")
@click.option(
    "--socket",
    "socket_path",
    metavar="PATH",
    help="The socket to listen on (default: runtime.service in the config, "
    "/run/gpuhook/runtime.sock).",
)
@pass_ctx
def runtime_serve(obj: Context, socket_path: str | None) -> None:
    """Run the runtime service until SIGTERM: gpuhook-runtime hands it the creates that need a
    decision, so they start no Python interpreter (systemd: gpuhook-runtime.service).

    Optional: while it is not running, gpuhook-runtime starts Python for those creates itself.
    The socket is the running user's only (mode 0600); a caller of another user, namespace or
    root folder is left to start Python itself."""

    config = obj.config(structlog=False)
    path = os.path.abspath(socket_path) if socket_path else config.service_socket
    if not path:
        raise UsageError(
            f"runtime serve: runtime.service is empty in {config.source} (the runtime service "
            "is disabled); set it there or give --socket PATH"
        )
    service.start(path, obj.config_file)  # listens here, then execs the service's process


@click.group("hook", context_settings={"ignore_unknown_options": True})
def hook_group() -> None:
    """OCI hooks run by the container runtime (not for interactive use)."""


@hook_group.command("update-ldcache", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def hook_update_ldcache(args: tuple[str, ...]) -> None:
    """Refresh a container's ld.so.cache (reads the OCI state on stdin)."""

    raise click.exceptions.Exit(hook_main(["update-ldcache", *args]))
