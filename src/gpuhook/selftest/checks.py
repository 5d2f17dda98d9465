"""The self test's checks, each a real container judged by what it saw inside and by the
decision record ``gpuhook inspect container`` finds for it.

- ``plain``: a container without any GPU marker (gpuhook-runtime's fast path: no Python, no
  record) runs and sees no GPU.
- ``gpu N`` / ``mig N:M``: granted one device (a CDI annotation, as the device plugin's path
  writes it), the container sees that device's nodes alone and the injected ``nvidia-smi -L``
  lists it alone; ``cuda ...`` runs the CUDA program there.
- ``kubernetes``: a pod's container (containerd's identity annotations) with no allocation and
  ``NVIDIA_VISIBLE_DEVICES=all`` from its image sees no GPU.
- ``mps <group>``: a client of each MPS share group gets the limits its record states, and the
  group's control daemon answers it through the mounted pipe folder.
"""

from __future__ import annotations

import re
import uuid
from typing import TYPE_CHECKING

from gpuhook.errors import UsageError
from gpuhook.inventory import driverroot
from gpuhook.model.decision import VERDICT_SUPERSEDED
from gpuhook.model.frozen import Frozen, _init
from gpuhook.selftest import bundle, cuda
from gpuhook.selftest.report import FAIL, PASS, SKIP, Result

if TYPE_CHECKING:
    from gpuhook.model.inventory import Gpu, Inventory, MigDevice
    from gpuhook.selftest.session import Container, Session

CDI_KEY = "cdi.k8s.io/gpuhook-selftest"
CAPABILITIES = "NVIDIA_DRIVER_CAPABILITIES=compute,utility"
NODE_FIX = (
    "load the NVIDIA kernel modules and create the device nodes (nvidia-modprobe -c <minor> -u, "
    "or run nvidia-smi once), then: gpuhook inventory refresh"
)
WRONG_FIX = "gpuhook inventory refresh (the node changed?), then gpuhook doctor"
CUDA_FIX = (
    "run the program on the host to tell the driver from the container: if it fails there too, "
    "fix the driver or CUDA install; else gpuhook doctor"
)
UUID_RE = re.compile(r"\(UUID: ((?:GPU|MIG)-[^)\s]+)\)")


class Target(Frozen):
    """A device the self test grants a container: a whole GPU, or one MIG device."""

    label: str
    uuid: str
    gpu: Gpu
    mig: MigDevice | None

    def __init__(self, gpu: Gpu, mig: MigDevice | None = None) -> None:
        label = f"mig {mig.display_id}" if mig is not None else f"gpu {gpu.index}"
        _init(self, label=label, uuid=mig.uuid if mig else gpu.uuid, gpu=gpu, mig=mig)

    def what(self) -> str:
        if self.mig is not None:
            return f"MIG {self.mig.display_id} {self.mig.uuid} ({self.mig.name})"
        return f"GPU {self.gpu.index} {self.gpu.uuid}"


def targets(inventory: Inventory, wanted: tuple[str, ...]) -> list[Target]:
    """Every GPU not in MIG mode and every MIG device, or those ``wanted`` names (GPU index or
    UUID, ``<gpu>:<mig>`` or MIG UUID; a MIG-mode GPU stands for its MIG devices)."""
    every: dict[str, list[Target]] = {}
    for gpu in inventory.gpus:
        own = [Target(gpu, mig) for mig in gpu.mig_devices] if gpu.mig_enabled else [Target(gpu)]
        every[str(gpu.index)] = every[gpu.uuid] = own
        for t in own:
            if t.mig is not None:
                every[t.mig.display_id] = every[t.mig.uuid] = [t]
    if not wanted:
        return [t for gpu in inventory.gpus for t in every[gpu.uuid]]
    chosen: list[Target] = []
    for name in (n.strip() for value in wanted for n in value.split(",")):
        if name not in every:
            known = ", ".join(t.label for gpu in inventory.gpus for t in every[gpu.uuid])
            raise UsageError(f"selftest --gpu {name}: this node has no such device ({known})")
        chosen += [t for t in every[name] if t not in chosen]
    return chosen


# --- plain --------------------------------------------------------------------------------------


def check_plain(session: Session) -> Result:
    """A container with no GPU marker: straight to runc, no record, no GPU."""
    c = session.container("plain", {}, [], gpu=False)
    failed = session.failed("plain", c)
    if failed is not None:
        return failed
    seen = c.seen.gpu_nodes() + c.seen.cap_nodes()
    if seen:
        what = ", ".join(seen)
        return Result("plain", FAIL, f"a container that asked for no GPU saw {what}", WRONG_FIX)
    if c.record is not None:
        return Result(
            "plain",
            FAIL,
            f"a spec without a GPU marker got a decision record ({c.container_id}): "
            "gpuhook-runtime started Python for it instead of passing it straight to runc",
            "rebuild or reinstall gpuhook (its gpuhook-runtime)",
        )
    return Result(
        "plain",
        PASS,
        "a container without a GPU request ran through gpuhook-runtime straight to the runtime "
        "(no record, no GPU)",
    )


# --- one device ---------------------------------------------------------------------------------


def host_nodes_problem(session: Session, target: Target) -> str:
    """Why the target's device nodes are not on the host as the inventory lists them."""

    dev_root = session.config.dev_root
    gpu = target.gpu
    wanted = [(gpu.node, f"/dev/nvidia{gpu.minor}", f"GPU {gpu.index}")]
    if target.mig is not None:
        wanted += [(cap, cap.path, f"MIG {target.mig.display_id}") for cap in target.mig.caps]
    for node, path, what in wanted:
        host = driverroot.host_path(dev_root, path)
        found = driverroot.read_node(dev_root, path)
        if node is None or found is None:
            return (
                f"{host} ({what}) is missing on the host: NVML and engines that pass device "
                "nodes (CDI, --device) cannot reach it"
            )
        if (found.major, found.minor) != (node.major, node.minor):
            return (
                f"{host} is {found.major}:{found.minor}; the inventory says "
                f"{node.major}:{node.minor}"
            )
    return ""


def check_device(session: Session, target: Target) -> list[Result]:
    """Grant the container the target alone; it must see it alone. With ``--cuda``, the CUDA
    program's line follows."""
    problem = host_nodes_problem(session, target)
    if problem:
        return [Result(target.label, FAIL, problem, NODE_FIX)]
    c = session.container(target.label, {CDI_KEY: f"nvidia.com/gpu={target.uuid}"}, [CAPABILITIES])
    failed = session.failed(target.label, c)
    results = [failed or judge_device(session, target, c)]
    if session.cuda is not None and session.cuda.path:
        if failed is not None:
            why = f"its container failed (see {target.label})"
            results.append(Result(f"cuda {target.label}", SKIP, why))
        else:
            results.append(cuda_result(f"cuda {target.label}", c, target.uuid, ""))
    return results


def judge_device(session: Session, target: Target, c: Container) -> Result:
    gpu, mig = target.gpu, target.mig
    node = gpu.node.path if gpu.node is not None else f"/dev/nvidia{gpu.minor}"
    caps = sorted(cap.path for cap in mig.caps) if mig is not None else []
    seen_nodes, seen_caps = c.seen.gpu_nodes(), c.seen.cap_nodes()
    label = target.label
    if seen_nodes != [node] or seen_caps != caps:
        got = ", ".join(seen_nodes + seen_caps) or "no GPU node"
        want = ", ".join([node, *caps])
        what = f"the container got {got}; {target.what()} is {want}"
        return Result(label, FAIL, what, WRONG_FIX)
    listed = ""
    if session.smi:
        smi = c.seen.sections.get(bundle.SMI)
        if smi is None or smi.code != 0:
            why = "not in the container" if smi is None else f"exit {smi.code}: {smi.last()}"
            what = f"nvidia-smi -L in the container failed ({why})"
            return Result(label, FAIL, what, "gpuhook doctor (libraries utility, hook)")
        uuids = UUID_RE.findall("\n".join(smi.lines))
        expected = [gpu.uuid] + ([mig.uuid] if mig is not None else [])
        if sorted(uuids) != sorted(expected):
            return Result(
                label,
                FAIL,
                f"nvidia-smi -L in the container listed {', '.join(uuids) or 'nothing'}; "
                f"expected {', '.join(expected)}",
                WRONG_FIX,
            )
        listed = " and nvidia-smi -L listed it alone"
    record = record_problem(c, [target.uuid])
    if record:
        return Result(label, FAIL, record, "gpuhook doctor (state dir)")
    channel = (c.record.decision.channel or "") if c.record is not None else ""
    return Result(
        label,
        PASS,
        f"{target.what()}: the container saw {', '.join([node, *caps])} only{listed}; its "
        f"decision record grants it ({channel})",
    )


def record_problem(c: Container, granted: list[str]) -> str:
    """Why the container's record is not found, or does not grant ``granted``; ""."""
    if c.record is None:
        return (
            f"gpuhook inspect container {c.container_id} finds no record: {c.record_problem}"
        )
    got = [d.uuid for d in c.record.decision.devices]
    if sorted(got) != sorted(granted):
        return (
            f"the record of {c.container_id} grants {', '.join(got) or 'nothing'}; "
            f"the container was given {', '.join(granted) or 'nothing'}"
        )
    return ""


def cuda_result(check: str, c: Container, expected_uuid: str, mps_note: str) -> Result:
    ok, line = cuda.judge(c.seen.sections.get(bundle.CUDA), expected_uuid, mps_note)
    return Result(check, PASS if ok else FAIL, line, "" if ok else CUDA_FIX)


# --- the default-"all" leak ---------------------------------------------------------------------


def check_kubernetes(session: Session) -> Result:
    """A pod's container that no device plugin gave a GPU, whose image says
    ``NVIDIA_VISIBLE_DEVICES=all``: it must see no GPU (the stock runtime gives it every one)."""
    name = "kubernetes"
    config = session.config
    if config.policy.kubernetes_env_requests == "trust":
        return Result(
            name,
            SKIP,
            f"policy.kubernetes.env_requests is trust in {config.source}: an unallocated pod's "
            "NVIDIA_VISIBLE_DEVICES=all gets every GPU, by choice (the stock runtime's leak)",
            f"set policy.kubernetes.env_requests: verify in {config.source}",
        )
    pod = {
        "io.kubernetes.cri.container-type": "container",
        "io.kubernetes.cri.sandbox-uid": str(uuid.uuid4()),
        "io.kubernetes.cri.sandbox-namespace": "gpuhook-selftest",
        "io.kubernetes.cri.sandbox-name": "selftest",
        "io.kubernetes.cri.container-name": "probe",
    }
    c = session.container(name, pod, ["NVIDIA_VISIBLE_DEVICES=all", CAPABILITIES])
    failed = session.failed(name, c)
    if failed is not None:
        return failed
    seen = c.seen.gpu_nodes() + c.seen.cap_nodes()
    smi = c.seen.sections.get(bundle.SMI)
    listed = UUID_RE.findall("\n".join(smi.lines)) if smi is not None else []
    if seen or listed:
        return Result(
            name,
            FAIL,
            "an unallocated pod container whose image sets NVIDIA_VISIBLE_DEVICES=all saw "
            f"{', '.join(seen + listed)} (the default-all leak)",
            f"check policy.kubernetes in {config.source} (verify or ignore), then gpuhook "
            "inspect spec on such a bundle",
        )
    problem = record_problem(c, [])
    if problem:
        return Result(name, FAIL, problem, "gpuhook doctor (state dir)")
    reasons = c.record.decision.reasons if c.record is not None else ()
    why = next((r.why for r in reasons if r.verdict != VERDICT_SUPERSEDED), "no reason given")
    return Result(
        name,
        PASS,
        "an unallocated pod container (containerd's identity annotations) whose image sets "
        f"NVIDIA_VISIBLE_DEVICES=all saw no GPU (NVIDIA_VISIBLE_DEVICES="
        f"{c.seen.env.get('NVIDIA_VISIBLE_DEVICES', 'unset')}): {why}",
    )
