"""``gpuhook doctor`` and ``gpuhook selftest``: check the node, and prove it works with real
containers."""

from __future__ import annotations

import click

from gpuhook import log
from gpuhook.cli import doctor, tables
from gpuhook.cli.base import Context, emit, output_option, pass_ctx
from gpuhook.engines import readers
from gpuhook.errors import (
    ChecksFailedError,
    ConfigError,
    UsageError,
)
from gpuhook.selftest import report
from gpuhook.selftest.run import run as run_selftest
from gpuhook.selftest.session import Options


@click.command("doctor")
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


@click.command("selftest")
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
    for each failure, and each container's create call against plain runc's; exit 1 when any
    check fails."""

    if cuda_program and not cuda:
        raise UsageError("selftest: --cuda-program needs --cuda")
    options = Options(gpus, cuda, cuda_program or "", runtime_path or "")
    view = run_selftest(obj.config(), options)
    log.get_logger().info("selftest", ok=view["ok"], **view["summary"])
    emit(view, output, report.table)
    if not view["ok"]:
        failed = [c["check"] for c in view["checks"] if c["status"] == report.FAIL]
        raise ChecksFailedError(f"selftest: {len(failed)} failed: {', '.join(failed)}")
