"""The ``gpuhook`` command line (click lives here only). Thin: parse, call the core, render.

Every failure leaves through :func:`run`, which maps it with :func:`gpuhook.errors.describe`
to an exit code and one line on stderr.
"""

from __future__ import annotations

import os
import sys

import click

from gpuhook import __version__, log
from gpuhook.cli.render import FORMATS, to_json, to_yaml
from gpuhook.config import loading as config_loading
from gpuhook.config.types import ENV_DEBUG
from gpuhook.engines import readers
from gpuhook.engines.common import DEFAULT_NAME, DEFAULT_RUNTIME_PATH, unified_diff
from gpuhook.errors import CdiError, RecordNotFoundError, UsageError, describe
from gpuhook.runtime import locate

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable
    from typing import Any

    from gpuhook.config.types import Config
    from gpuhook.model.inventory import Inventory


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


# --- config ------------------------------------------------------------------------------------


@main.group("config")
def config_group() -> None:
    """Validate gpuhook's configuration."""


@config_group.command("validate")
@click.argument("path", required=False)
@click.option("--show", is_flag=True, help="Print the configuration with defaults filled in.")
@pass_ctx
def config_validate(obj: Context, path: str | None, show: bool) -> None:
    """Check a config file (default: the one in use) against the schema."""
    config = config_loading.load(path or obj.config_file, use_cache=False)
    if show:
        click.echo(to_yaml(config.data), nl=False)
    runtime = config.runtime or "NOT FOUND"
    click.echo(f"{config.source}: valid (runtime {runtime})")


# --- inventory -----------------------------------------------------------------------------------


@main.group("inventory")
def inventory_group() -> None:
    """The node inventory (GPUs from NVML, driver files, device nodes)."""


def _refresh(config: Config) -> tuple[Inventory, str]:
    """Refresh the inventory, the /dev/char links of its device nodes and, when ``cdi.output``
    is set, the CDI spec made from it (every refresh a person asks for; the lazy one of the
    create path does neither). A spec that would name the same devices as another spec in
    ``cdi.spec_dirs`` is not written: a warning line says which and what to do."""
    from gpuhook.engines import cdi
    from gpuhook.inventory import devchar, store

    inventory = store.refresh(config)
    made, problems = devchar.ensure(config.dev_root, inventory)
    if made:
        log.get_logger().info("dev char links made", count=made)
    for problem in problems:
        click.echo(f"warning: {problem}", err=True)
    written, found = cdi.export(inventory, config)
    for conflict in found:
        click.echo(f"warning: {config.cdi_output} not written: {conflict.line()}", err=True)
    if found:
        click.echo(f"fix: {cdi.CONFLICT_FIX}", err=True)
    return inventory, written


@inventory_group.command("refresh")
@pass_ctx
def inventory_refresh(obj: Context) -> None:
    """Query NVML, scan the driver root and write the inventory file (and the CDI spec at
    cdi.output when one is configured)."""
    config = obj.config()
    inv, cdi_written = _refresh(config)
    migs = sum(len(g.mig_devices) for g in inv.gpus)
    mig_gpus = sum(1 for g in inv.gpus if g.mig_enabled)
    log.get_logger().info(
        "inventory refreshed",
        path=config.inventory_path,
        gpus=len(inv.gpus),
        mig_devices=migs,
        driver_version=inv.driver_version,
    )
    click.echo(
        f"{config.inventory_path}: {len(inv.gpus)} GPUs ({mig_gpus} MIG-enabled, "
        f"{migs} MIG devices), driver {inv.driver_version}, {len(inv.libraries)} "
        f"libraries"
    )
    if cdi_written:
        click.echo(f"{cdi_written}: CDI spec (kind nvidia.com/gpu) regenerated")
    for warning in inv.warnings:
        click.echo(f"warning: {warning}", err=True)


# --- cdi -----------------------------------------------------------------------------------------


@main.group("cdi")
def cdi_group() -> None:
    """The inventory as a CDI spec (kind nvidia.com/gpu), for engines that resolve CDI."""


@cdi_group.command("generate")
@click.option(
    "--output",
    "path",
    metavar="PATH",
    help="Write the spec there atomically (default: print it). Engines read /etc/cdi and "
    "/var/run/cdi.",
)
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["json", "yaml"]),
    default=None,
    help="Default: yaml for a .yaml/.yml PATH, else json.",
)
@pass_ctx
def cdi_generate(obj: Context, path: str | None, fmt: str | None) -> None:
    """Build the CDI spec from the cached inventory and validate it against the CDI schema."""
    from gpuhook.engines import cdi
    from gpuhook.inventory import store

    config = obj.config()
    data = cdi.spec(store.load_current(config), config)
    if path is None:
        cdi.validate(data)
        click.echo(cdi.render(data, fmt or "json").decode(), nl=False)
        return
    found = cdi.conflicts(data, path, config.cdi_spec_dirs)
    if found:
        raise CdiError(f"{path} not written: {found[0].line()}; {cdi.CONFLICT_FIX}")
    cdi.write(data, path, fmt)
    click.echo(f"{path}: {len(data['devices'])} CDI devices of kind {cdi.KIND}", err=True)


@cdi_group.command("list")
@output_option
@pass_ctx
def cdi_list(obj: Context, output: str | None) -> None:
    """The CDI device names the spec offers (nvidia.com/gpu=<name>) and what each one is."""
    from gpuhook.cli.render import table
    from gpuhook.engines import cdi
    from gpuhook.inventory import store

    config = obj.config()
    rows = [
        {
            "name": f"{cdi.KIND}={name}",
            "device": d.what,
            "nodes": [n.path for n in d.edits.device_nodes],
        }
        for d in cdi.devices(store.load_current(config))
        for name in d.names
    ]
    emit(
        {"devices": rows},
        output,
        lambda view, _color: table(
            ["NAME", "DEVICE", "NODES"],
            [[r["name"], r["device"], ",".join(r["nodes"])] for r in view["devices"]],
        ),
    )


# --- inspect -------------------------------------------------------------------------------------


@main.group("inspect")
def inspect_group() -> None:
    """Explain the node, a spec, or a container's decision."""


@inspect_group.command("node")
@output_option
@click.option("--refresh", is_flag=True, help="Refresh the inventory first.")
@pass_ctx
def inspect_node(obj: Context, output: str | None, refresh: bool) -> None:
    """GPUs, MIG devices, driver, device nodes and libraries, from the inventory."""
    from gpuhook.cli import tables
    from gpuhook.inventory import store

    config = obj.config()
    if refresh:
        _refresh(config)
    status = store.status(config)
    mps_state = None
    if status.inventory is not None and config.mps.enabled:
        from gpuhook.mps import daemons

        mps_state = daemons.node_state(config, status.inventory)
    emit(tables.node_view(config, status, mps_state), output, tables.node_table)


@inspect_group.command("spec")
@click.argument("path", required=False)
@click.option("--bundle", "-b", metavar="DIR", help="OCI bundle folder holding config.json.")
@output_option
@click.option("--diff", is_flag=True, help="Print a unified diff of config.json instead.")
@pass_ctx
def inspect_spec(
    obj: Context, path: str | None, bundle: str | None, output: str | None, diff: bool
) -> None:
    """Dry run: what gpuhook-runtime would decide and inject for a bundle or config.json."""
    from gpuhook.cli import decisions
    from gpuhook.runtime import decide, ocispec

    target = bundle or path
    if not target:
        raise UsageError("inspect spec: give a bundle folder (--bundle DIR) or a config.json path")
    if os.path.isdir(target):
        bundle_dir = target
        raw = ocispec.read_raw(target)
        source = ocispec.config_path(target)
    else:
        bundle_dir = os.path.dirname(os.path.abspath(target))
        source = target
        try:
            with open(target, "rb") as fh:
                raw = fh.read()
        except OSError as exc:
            raise UsageError(f"cannot read {target}: {exc.strerror}") from None
    spec = ocispec.parse(raw, bundle_dir)
    config = obj.config()

    bundle_abs = os.path.abspath(bundle_dir)
    # a dry run over a live container's bundle must not count that container twice
    admit = decide.read_only_admission(config, exclude_bundle=bundle_abs)
    outcome = decide.run(spec, config, bundle=bundle_abs, mps_admit=admit)
    if diff:
        import json

        before, after = (json.dumps(s, indent=2) for s in (spec, outcome.spec))
        click.echo(unified_diff(before, after, source, now=""), nl=False)
        return
    emit(decisions.outcome_view(outcome, bundle_abs), output, decisions.spec_table)


# --- runtime registration ---------------------------------------------------------------------


@main.group("runtime")
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
    dry_run: bool,
    set_as_default: bool,
    runtime_path: str,
) -> None:
    """Register gpuhook-runtime in docker's daemon.json, containerd's config.toml or podman's
    containers.conf."""
    from gpuhook.engines import configure

    plan = configure.plan(
        engine,
        configure.CONFIGURE,
        config_path=engine_config,
        name=runtime_name,
        runtime_path=runtime_path,
        set_default=set_as_default,
        drop_in=drop_in,
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
    engine: str, engine_config: str | None, runtime_name: str, drop_in: str | None, dry_run: bool
) -> None:
    """Remove what `runtime configure` added; runc becomes the default again if gpuhook was."""
    from gpuhook.engines import configure

    plan = configure.plan(
        engine,
        configure.UNCONFIGURE,
        config_path=engine_config,
        name=runtime_name,
        drop_in=drop_in,
    )
    _report_plan(plan, dry_run, "is not registered")


def _report_plan(plan: Any, dry_run: bool, unchanged: str) -> None:
    from gpuhook.engines import configure

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
    from gpuhook.runtime import service

    config = obj.config(structlog=False)
    path = os.path.abspath(socket_path) if socket_path else config.service_socket
    if not path:
        raise UsageError(
            f"runtime serve: runtime.service is empty in {config.source} (the runtime service "
            "is disabled); set it there or give --socket PATH"
        )
    logger = log.get_logger(socket=path, pid=os.getpid())

    def announce(line: str) -> None:
        logger.info("runtime service started", version=__version__, config=config.source)
        click.echo(line)

    import signal

    signum = service.serve(path, announce)
    logger.info("runtime service stopped", signal=signal.Signals(signum).name)


# --- node (the DaemonSet's installer) -----------------------------------------------------------


@main.group("node")
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
def node_install(
    host_root: str,
    no_restart: bool,
    node_config: str | None,
    engine: str,
    ready_file: str,
    no_wait: bool,
) -> None:
    """Install gpuhook on the node, then wait and uninstall it on SIGTERM.

    Copies the runtime (this image's interpreter, libraries and loader) to /opt/gpuhook, writes
    /etc/gpuhook/config.yaml, refreshes the inventory, registers /opt/gpuhook/bin/gpuhook-runtime
    as the engine's default runtime and restarts the engine through the host's PID 1.
    """
    from gpuhook.node import bundle, install

    host_root = os.path.abspath(host_root)
    if no_wait:
        source = bundle.image_source()
        for line in install.install(host_root, node_config, engine, not no_restart, source):
            click.echo(line)
        return
    install.serve(host_root, node_config, engine, not no_restart, ready_file, _echo_flush)


@node_group.command("uninstall")
@_host_root_option
def node_uninstall(host_root: str, no_restart: bool) -> None:
    """Unregister gpuhook-runtime, restart the engine, remove what `node install` put there."""
    from gpuhook.node import install

    for line in install.uninstall(os.path.abspath(host_root), not no_restart):
        click.echo(line)


def _echo_flush(line: str) -> None:
    click.echo(line)
    sys.stdout.flush()


# --- the entry ----------------------------------------------------------------------------------


@main.group("hook", context_settings={"ignore_unknown_options": True})
def hook_group() -> None:
    """OCI hooks run by the container runtime (not for interactive use)."""


@hook_group.command("update-ldcache", context_settings={"ignore_unknown_options": True})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def hook_update_ldcache(args: tuple[str, ...]) -> None:
    """Refresh a container's ld.so.cache (reads the OCI state on stdin)."""
    from gpuhook.runtime.hooks import main as hook_main

    raise click.exceptions.Exit(hook_main(["update-ldcache", *args]))


# --- mps ---------------------------------------------------------------------------------------


@main.group("mps")
def mps_group() -> None:
    """CUDA MPS control daemons of the MPS-shared GPUs (mps.* in the config).

    GPU arguments are GPU indices, GPU UUIDs or share-group names; none means every group.
    """


def _mps_daemons(obj: Context, gpus: tuple[str, ...]) -> list[Any]:
    from gpuhook.inventory import store
    from gpuhook.mps import daemons

    config = obj.config()
    return daemons.daemons(config, store.load_current(config), gpus)


def _mps_each(obj: Context, gpus: tuple[str, ...], action: str) -> None:
    """Run start or stop on every named group; the first failure is raised after the others ran."""
    from gpuhook.errors import GpuhookError

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
    from gpuhook.cli import tables

    config = obj.config()
    view = {
        "config": config.source,
        "root": config.mps.root,
        "groups": [d.status() for d in _mps_daemons(obj, gpus)],
    }
    emit(view, output, tables.mps_table)


# --- debuggability: inspect container, gc, doctor ------------------------------------------------


@inspect_group.command("container")
@click.argument("container_id", metavar="[ID]", required=False)
@click.option("--all", "-a", "show_all", is_flag=True, help="Every container with a record.")
@click.option("--gpu", "gpu_only", is_flag=True, help="With --all: only GPU requests.")
@click.option(
    "--root",
    "roots",
    multiple=True,
    metavar="DIR",
    help="The runtime's state folder (its --root) to look in for a container without a record.",
)
@output_option
@pass_ctx
def inspect_container(
    obj: Context,
    container_id: str | None,
    show_all: bool,
    gpu_only: bool,
    roots: tuple[str, ...],
    output: str | None,
) -> None:
    """What gpuhook-runtime decided for a container at create time, and why.

    ID is a full container id or a unique prefix of one. The answer comes from the decision
    record gpuhook-runtime wrote into the container's bundle (linked from
    <state_dir>/containers/), so it is what the container got. A container whose spec carries
    no GPU marker has no record: it is found through the runtime (<runtime> --root DIR state ID,
    in docker's and containerd's folders, or --root) and said to have asked for no GPU.
    """
    from gpuhook.cli import decisions
    from gpuhook.records import lookup

    if show_all == bool(container_id):
        raise UsageError("inspect container: give a container id (or a unique prefix), or --all")
    config = obj.config()
    if show_all:
        entries = lookup.scan(config.records_dir)
        records = [
            e.record
            for e in entries
            if e.record is not None and (not gpu_only or e.record.decision.gpu_container)
        ]
        deleted = sum(1 for e in entries if e.state == lookup.DELETED)
        emit(
            [r.data for r in records],
            output,
            lambda _view, color: decisions.records_table(records, deleted, color),
        )
        return
    try:
        entry = lookup.find(config, container_id or "")
    except RecordNotFoundError:
        roots_asked = lookup.candidate_roots(roots)
        view = lookup.unrecorded(config.runtime, roots_asked, container_id or "")
        if view is None:
            raise
        emit(view, output, lambda v, _color: v["why"] + "\n")
        return
    log.get_logger().debug("record read", container_id=entry.container_id, path=entry.target)
    record = entry.record
    if record is None:  # lookup.find returns live records only
        raise RecordNotFoundError(f"no decision record for container {entry.container_id!r}")
    emit(record.data, output, lambda _view, color: decisions.container_table(record, color))


@inspect_group.command("pod")
@click.argument("pod", metavar="NAMESPACE/NAME|UID")
@output_option
@pass_ctx
def inspect_pod(obj: Context, pod: str, output: str | None) -> None:
    """Every recorded container of one pod: what each asked for, what it got, and why.

    POD is NAMESPACE/NAME or the pod's UID (a container known only by the kubelet's mounts, as
    under cri-dockerd, has no pod name). From the decision records gpuhook-runtime wrote.
    """
    from gpuhook.cli import decisions
    from gpuhook.records import lookup

    records = lookup.find_pod(obj.config(), pod)
    view = {"pod": pod, "containers": [r.data for r in records]}
    emit(view, output, lambda _view, color: decisions.pod_table(records, color))


@main.command("gc")
@click.option("--dry-run", is_flag=True, help="Show what would be removed; remove nothing.")
@click.option(
    "--grace",
    type=click.FloatRange(min=0),
    default=60.0,
    show_default=True,
    metavar="SECONDS",
    help="Keep records younger than this (their create may still be under way).",
)
@output_option
@pass_ctx
def gc_command(obj: Context, dry_run: bool, grace: float, output: str | None) -> None:
    """Remove the record links of containers that no longer exist.

    Each container's decision record lives in its bundle and is linked from
    <state_dir>/containers/<id>.json. gc removes a link when the bundle is gone (the engine
    deleted the container), or when the runtime that created the container no longer has it
    (<runtime> --root <root> state <id> fails and its state folder has no such id). Live
    containers, recent records and anything gc cannot judge are kept, each with the reason.
    """
    from gpuhook.cli import tables
    from gpuhook.records import gc as records_gc

    config = obj.config()
    report = records_gc.gc(config, dry_run=dry_run, grace_s=grace)
    log.get_logger().info(
        "gc",
        dry_run=dry_run,
        removed=[i.container_id for i in report.removed],
        kept=len(report.items) - len(report.removed),
        live=report.live,
    )
    emit(report.to_dict(), output, tables.gc_table)


@main.command("doctor")
@output_option
@click.option(
    "--docker-config",
    metavar="PATH",
    default=readers.DEFAULT_PATHS[readers.DOCKER],
    show_default=True,
    help="docker's daemon.json to check.",
)
@click.option(
    "--containerd-config",
    metavar="PATH",
    default=readers.DEFAULT_PATHS[readers.CONTAINERD],
    show_default=True,
    help="containerd's config.toml to check.",
)
@click.option(
    "--podman-config",
    metavar="PATH",
    default=readers.DEFAULT_PATHS[readers.PODMAN],
    show_default=True,
    help="podman's containers.conf to check.",
)
@pass_ctx
def doctor_command(
    obj: Context,
    output: str | None,
    docker_config: str,
    containerd_config: str,
    podman_config: str,
) -> None:
    """Check the node: config, inventory, device nodes, driver libraries, the low-level runtime,
    the hook, docker/containerd/podman registration, the CDI spec, MPS, state and log folders,
    the kubelet checkpoint. One line per check, with the fix for each failure; exit 1 when any
    fails."""
    from gpuhook.cli import doctor, tables
    from gpuhook.errors import ChecksFailedError, ConfigError

    try:
        obj.config()  # logging, when the config is valid (the config check reports it if not)
    except ConfigError:
        pass
    node = doctor.Node(
        obj.config_file,
        docker_config=docker_config,
        containerd_config=containerd_config,
        podman_config=podman_config,
    )
    results = doctor.run(node)
    view = doctor.view(results)
    log.get_logger().info("doctor", ok=view["ok"], **view["summary"])
    for r in results:
        log.get_logger().debug("check", **r.to_dict())
    emit(view, output, tables.doctor_table)
    if not view["ok"]:
        failed = [c["check"] for c in view["checks"] if c["status"] == doctor.FAIL]
        raise ChecksFailedError(f"doctor: {len(failed)} failed: {', '.join(failed)}")


@main.command("selftest")
@output_option
@click.option(
    "--gpu",
    "gpus",
    multiple=True,
    metavar="ID",
    help="Test this GPU or MIG device only (index, UUID, GPU:MIG, MIG UUID; repeatable). "
    "Default: every GPU and MIG device.",
)
@click.option("--cuda", is_flag=True, help="Also run a CUDA program in the GPU containers.")
@click.option(
    "--cuda-program",
    metavar="PATH",
    help="The CUDA program --cuda runs (default: gpuhook's, built with the host's nvcc).",
)
@click.option(
    "--runtime",
    "runtime_path",
    metavar="PATH",
    help="The gpuhook-runtime to test (default: the one beside this gpuhook).",
)
@pass_ctx
def selftest_command(
    obj: Context,
    output: str | None,
    gpus: tuple[str, ...],
    cuda: bool,
    cuda_program: str | None,
    runtime_path: str | None,
) -> None:
    """Prove the node works: run real containers through gpuhook-runtime, as an engine does.

    A throwaway bundle made from this host's files (no image pull), a private runc --root and a
    temp folder, all removed afterwards; the node's engines and their containers are never
    touched. Checks: a plain container; each GPU and MIG device granted alone (nvidia-smi -L
    inside must list it alone, its decision record must say so); an unallocated pod container
    with NVIDIA_VISIBLE_DEVICES=all sees no GPU; each MPS group's client gets its limits and
    its daemon answers; with --cuda, a CUDA program in each. One line per check, with the fix
    for each failure, and each container's create-to-exit time against plain runc; exit 1 when
    any check fails."""
    from gpuhook.errors import ChecksFailedError
    from gpuhook.selftest import report
    from gpuhook.selftest.run import run as run_selftest
    from gpuhook.selftest.session import Options

    if cuda_program and not cuda:
        raise UsageError("selftest: --cuda-program needs --cuda")
    options = Options(gpus, cuda, cuda_program or "", runtime_path or "")
    view = run_selftest(obj.config(), options)
    log.get_logger().info("selftest", ok=view["ok"], **view["summary"])
    emit(view, output, report.table)
    if not view["ok"]:
        failed = [c["check"] for c in view["checks"] if c["status"] == report.FAIL]
        raise ChecksFailedError(f"selftest: {len(failed)} failed: {', '.join(failed)}")


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
            import traceback

            traceback.print_exc()
        return code
    return 0
