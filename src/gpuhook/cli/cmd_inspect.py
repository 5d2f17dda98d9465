"""``gpuhook inspect node|spec|container|pod`` and ``gpuhook gc``: explain the node and each
decision, and collect the record links of deleted containers."""

from __future__ import annotations

import json
import os
from typing import TYPE_CHECKING, Any

import click

from gpuhook import log
from gpuhook.cli import cmd_setup, decisions, dra_claims, tables
from gpuhook.cli.base import Context, emit, output_option, pass_ctx
from gpuhook.engines.common import unified_diff
from gpuhook.errors import RecordNotFoundError, UnexpectedUsersError, UsageError
from gpuhook.inventory import store
from gpuhook.mps import daemons
from gpuhook.nodeview import probe, table
from gpuhook.records import gc as records_gc
from gpuhook.records import lookup
from gpuhook.runtime import decide, ocispec

if TYPE_CHECKING:
    from gpuhook.config.types import Config


@click.group("inspect")
def inspect_group() -> None:
    """Explain the node, a spec, or a container's decision."""


@inspect_group.command("node")
@output_option
@click.option("--refresh", is_flag=True, help="Refresh the inventory first.")
@click.option(
    "--usage",
    is_flag=True,
    help="Who holds and uses each GPU and MIG device: the containers granted it, the processes "
    "on it, the MPS clients, and every unexpected user (exit status 3 when there is one).",
)
@pass_ctx
def inspect_node(obj: Context, output: str | None, refresh: bool, usage: bool) -> None:
    """GPUs, MIG devices, driver, device nodes and libraries, from the inventory.

    With --usage: per GPU and MIG device, the containers gpuhook granted it (from the decision
    records: pod, container, channel, MPS share and limits, since when), the processes NVML
    lists on it with the container and pod each belongs to (from its cgroup), the MPS clients
    of each share group, and every unexpected user: a process of a container that was refused
    or not granted that device, of a container gpuhook has no record of, or of the host. Exit
    status 3 when there is one (the view is printed first), 0 when there is none.
    """

    config = obj.config()
    if refresh:
        cmd_setup.refresh(config)
    if usage:
        _node_usage(config, output)
        return
    status = store.status(config)
    mps_state = None
    if status.inventory is not None and config.mps.enabled:
        mps_state = daemons.node_state(config, status.inventory)
    emit(tables.node_view(config, status, mps_state), output, tables.node_table)


def _node_usage(config: Config, output: str | None) -> None:
    snap = probe.snapshot(config, store.read(config))
    view = table.view(snap)
    emit(view, output, table.text)
    if view["unexpected_count"]:
        raise UnexpectedUsersError(
            f"{view['unexpected_count']} unexpected GPU user(s): a process on a GPU gpuhook did "
            "not grant to its container (see 'unexpected' above)"
        )


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
        before, after = (json.dumps(s, indent=2) for s in (spec, outcome.spec))
        click.echo(unified_diff(before, after, source, now=""), nl=False)
        return
    emit(decisions.outcome_view(outcome, bundle_abs), output, decisions.spec_table)


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
    under cri-dockerd, has no pod name). From the decision records gpuhook-runtime wrote, and
    the pod's DRA claims (the kubelet's dra_manager_state) with what keeps them from starting:
    a pod whose create was refused has no record, but its UID still finds its claims.
    """

    config = obj.config()
    try:
        records = lookup.find_pod(config, pod)
    except RecordNotFoundError:
        if "/" in pod:  # a refused pod has no record: only its UID finds its claims
            raise
        records = []
    uids = {r.kubernetes.pod_uid for r in records if r.kubernetes is not None}
    claims = dra_claims.of_pods(config, uids | ({pod} if "/" not in pod else set()))
    if not records and not claims:
        lookup.find_pod(config, pod)  # raises its one line
    view: dict[str, Any] = {"pod": pod, "containers": [r.data for r in records]}
    if claims:
        view["dra_claims"] = claims

    def table(_view: Any, color: bool) -> str:
        head = decisions.pod_table(records, color) if records else f"pod {pod}: no record\n"
        return head + dra_claims.table(claims)

    emit(view, output, table)


@click.command("gc")
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
