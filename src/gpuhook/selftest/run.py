"""``gpuhook selftest``, start to end: the setup lines (runtime, inventory, CUDA program,
bundle), the containers (:mod:`gpuhook.selftest.checks`, :mod:`gpuhook.selftest.mps_check`),
then the cleanup, which runs whatever happened before it."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

from gpuhook.config import locate
from gpuhook.errors import GpuhookError
from gpuhook.runtime import decide, service
from gpuhook.selftest import checks, cuda, lifecycle, report, rootfs
from gpuhook.selftest.mps_check import check_mps
from gpuhook.selftest.report import FAIL, PASS, SKIP, Result
from gpuhook.selftest.session import (
    Interrupted,
    Session,
    hold_signals,
    on_signals,
    restore_signals,
)

if TYPE_CHECKING:
    from typing import Any

    from gpuhook.config.types import Config
    from gpuhook.model.inventory import Inventory
    from gpuhook.selftest.session import Options

NO_CUDA = (
    "no CUDA program: give --cuda-program PATH, or install nvcc (the CUDA toolkit) on the node"
)


def run(config: Config, options: Options) -> dict[str, Any]:
    """Run the self test; its view (``ok``, the check lines, the timings). Raises
    :class:`gpuhook.errors.UsageError` for a ``--gpu`` this node does not have, before any
    container runs."""
    inventory, inventory_line = load_inventory(config)
    chosen = checks.targets(inventory, options.gpus) if inventory is not None else []
    session = Session(config, options)
    session.inventory = inventory
    previous = on_signals()
    lifecycle.become_subreaper(True)
    results: list[Result] = []
    try:
        results += [runtime_line(session), inventory_line]
        if options.cuda and inventory is not None:
            results.append(cuda_line(session))
        if all(r.status != FAIL for r in results if r.check != "cuda"):
            results.append(bundle_line(session))
            if results[-1].status == PASS:
                results += containers(session, chosen)
    except Interrupted as exc:
        end = finish(session, previous)
        if end.status == FAIL:  # say what is left, in the one line
            raise Interrupted(f"{exc}; {end.message}", exc.signum) from None
        raise
    except BaseException:
        finish(session, previous)
        raise
    results.append(finish(session, previous))
    return report.view(results, session.timings, session.work_dir, session.runtimes())


def finish(session: Session, previous: dict[int, Any]) -> Result:
    """The cleanup, which no signal interrupts; then this process is as it was."""
    hold_signals()
    try:
        return session.cleanup()
    finally:
        lifecycle.become_subreaper(False)
        restore_signals(previous)


def load_inventory(config: Config) -> tuple[Inventory | None, Result]:
    """The inventory (refreshed first when it is missing or stale, as a create would)."""

    fix = "gpuhook inventory refresh"
    try:
        inventory = decide.inventory(config)
    except GpuhookError as exc:
        return None, Result("inventory", FAIL, str(exc), fix)
    where = config.inventory_path
    if not inventory.gpus:
        return None, Result(
            "inventory",
            FAIL,
            f"{where}: NVML reports no GPU (driver {inventory.driver_version or 'unknown'})",
            f"check the driver (nvidia-smi), then: {fix}",
        )
    migs = sum(len(g.mig_devices) for g in inventory.gpus)
    return inventory, Result(
        "inventory",
        PASS,
        f"{where}: {len(inventory.gpus)} GPUs, {migs} MIG devices, driver "
        f"{inventory.driver_version}",
    )


def runtime_line(session: Session) -> Result:
    """gpuhook-runtime, what it wraps, and whether the runtime service takes its creates."""

    path, config = session.gpuhook.path, session.config
    if os.geteuid() != 0:
        return Result("runtime", FAIL, "needs root: runc creates the containers", "run it as root")
    if not (os.path.isfile(path) and os.access(path, os.X_OK)):
        return Result(
            "runtime",
            FAIL,
            f"{path} is not an executable file",
            "install gpuhook, or name the gpuhook-runtime to test: --runtime PATH",
        )
    socket = config.service_socket
    if not socket:
        how = "runtime service disabled (runtime.service is empty): GPU creates start Python"
    else:
        problem = service.probe(socket)
        how = (
            f"runtime service not running ({problem}): GPU creates start Python"
            if problem
            else f"the runtime service at {socket} decides GPU creates"
        )
    wrapped = config.runtime or "not found"
    return Result(
        "runtime",
        PASS,
        f"{path} (low-level runtime: {wrapped}); {how}; private --root {session.root}",
    )


def cuda_line(session: Session) -> Result:
    folder = os.path.join(session.work_dir, "cuda")
    os.makedirs(folder, exist_ok=True)
    gpus = session.inventory.gpus if session.inventory is not None else ()
    capabilities = [g.compute_capability for g in gpus]
    program = cuda.program(session.options.cuda_program, folder, capabilities)
    session.cuda = program
    if program.problem:
        return Result(
            "cuda",
            FAIL,
            f"{program.origin}: {program.problem}",
            "give a program built elsewhere: --cuda-program PATH (nvcc -cudart static -o PATH "
            f"{cuda.SOURCE})",
        )
    if not program.path:
        return Result("cuda", SKIP, NO_CUDA)
    return Result("cuda", PASS, f"the CUDA program: {program.origin}")


def bundle_line(session: Session) -> Result:
    """Build the rootfs template from the host's files; the injected programs' paths."""
    inventory = session.inventory
    binaries = {f.name: f for f in (inventory.files if inventory else ()) if f.kind == "binary"}
    smi, control = binaries.get("nvidia-smi"), binaries.get("nvidia-cuda-mps-control")
    session.smi = smi.container_path if smi is not None else ""
    session.mps_control = control.container_path if control is not None else ""
    programs = [f.path for f in (smi, control) if f is not None]
    files = {}
    if session.cuda is not None and session.cuda.path:
        programs.append(session.cuda.path)
        files[rootfs.CUDA_PROGRAM] = session.cuda.path
    dest = os.path.join(session.work_dir, "rootfs")
    busybox = locate.which("busybox")
    if inventory is None:
        raise RuntimeError("bundle_line needs the inventory")
    try:
        built = rootfs.build(dest, inventory, busybox, programs, session.config.ldconfig, files)
    except (OSError, GpuhookError) as exc:
        return Result(
            "bundle",
            FAIL,
            f"cannot build the rootfs in {dest}: {exc}",
            "install busybox (static), or check the host's /bin/sh and its libraries",
        )
    session.rootfs = built
    return Result(
        "bundle",
        PASS,
        f"rootfs of this host's {built.describe()} in {session.work_dir} (no image pulled)",
    )


def containers(session: Session, chosen: list[checks.Target]) -> list[Result]:
    plain = checks.check_plain(session)
    if plain.status != PASS:
        return [
            plain,
            Result("gpus", SKIP, "not run: no container runs through gpuhook-runtime (see plain)"),
        ]
    results = [plain]
    for gpu in session.inventory.gpus if session.inventory is not None else ():
        if gpu.mig_enabled and not gpu.mig_devices and not session.options.gpus:
            why = "in MIG mode without MIG devices: nothing to grant (nvidia-smi mig -cgi ...)"
            results.append(Result(f"gpu {gpu.index}", SKIP, why))
    for target in chosen:
        results += checks.check_device(session, target)
    results.append(checks.check_kubernetes(session))
    results += check_mps(session, {t.gpu.index for t in chosen})
    return results
