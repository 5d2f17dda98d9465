"""``gpuhook config``, ``gpuhook inventory`` and ``gpuhook cdi``: the config, the node's
inventory and the CDI spec made from it."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from gpuhook import log
from gpuhook.cli.base import Context, emit, output_option, pass_ctx
from gpuhook.cli.render import table, to_yaml
from gpuhook.config import loading as config_loading
from gpuhook.engines import cdi
from gpuhook.errors import CdiError
from gpuhook.inventory import devchar, store
from gpuhook.runtime import decide, prepared

if TYPE_CHECKING:
    from gpuhook.config.types import Config
    from gpuhook.model.inventory import Inventory


@click.group("config")
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


@click.group("inventory")
def inventory_group() -> None:
    """The node inventory (GPUs from NVML, driver files, device nodes)."""


def refresh(config: Config) -> tuple[Inventory, str]:
    """Refresh the inventory, the /dev/char links of its device nodes and, when ``cdi.output``
    is set, the CDI spec made from it (every refresh a person asks for; the lazy one of the
    create path does neither). A spec that would name the same devices as another spec in
    ``cdi.spec_dirs`` is not written: a warning line says which and what to do."""

    inventory = store.refresh(config, finish=prepared.finish)
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
    inv, cdi_written = refresh(config)
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


@click.group("cdi")
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

    config = obj.config()
    data = cdi.spec(decide.inventory(config), config)
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

    config = obj.config()
    rows = [
        {
            "name": f"{cdi.KIND}={name}",
            "device": d.what,
            "nodes": [n.path for n in d.edits.device_nodes],
        }
        for d in cdi.devices(decide.inventory(config))
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
