"""The bench's cases (what each container's spec carries), the runtimes' names and the
targets the report checks."""

from __future__ import annotations

from typing import Any

# (key, label, node, what the spec carries). node "a": 8 GPUs; node "b": 8 GPUs x 7 MIG devices.
CASES: tuple[tuple[str, str, str], ...] = (
    ("nongpu", "non-GPU container", "a"),
    ("leak", "leak case (env all, k8s, no allocation)", "a"),
    ("gpu1", "1 GPU", "a"),
    ("gpu1big", "1 GPU, big image (3,000 libraries)", "a"),
    ("gpu8", "8 GPUs", "a"),
    ("mig56", "1 MIG device, 56-MIG inventory", "b"),
)
# The cases whose bundles get the big image's rootfs, and its size.
BIG_IMAGE_CASES = frozenset({"gpu1big"})
BIG_IMAGE_LIBRARIES = 3000
PASSTHROUGH = ("passthrough", "passthrough call (list)")
# The machine's speed, for comparing runs across machines: the bare interpreter start that every
# create pays (the reference machine: 6.6 ms), measured interleaved with the cases.
INTERP = ("interp", "/usr/bin/python3 -I -S -c pass")
# What runc itself spends on the edits of a 1-GPU container (device nodes, bind mounts, the
# ld.so.cache hook): plain runc on the spec gpuhook wrote, so gpuhook's own share of the 1-GPU
# overhead is the rest.
EDITED = ("edited", "plain runc on gpuhook's 1-GPU spec")
# The parts of that spec, each run by plain runc in the same run: without gpuhook's ldcache hook
# (the device nodes and mounts alone), and with the driver's library folders bound per file (a
# tmpfs and a bind per library and soname, the hook making the links and running ldconfig), as
# before the prepared folders of issue 37.
NOHOOK = ("nohook", "plain runc on gpuhook's 1-GPU spec without its hook")
PER_FILE = ("perfile", "plain runc on gpuhook's 1-GPU spec, libraries bound per file")
RUNC_PARTS = (EDITED, NOHOOK, PER_FILE)

# Targets (medians on the 2-core reference machine, same run), checked on every run: issue 14's
# for the non-GPU and leak cases and the passthrough call, issue 37's for the GPU cases: 1 GPU
# within 5 ms of runc, gpuhook's own share of it (its 1-GPU lifecycle over plain runc's on the
# spec gpuhook wrote, the median of the per-iteration differences) within 1.5 ms, and 8 GPUs, a
# MIG device and the big image within 1 ms of 1 GPU.
TARGET_OVERHEAD_MS = {"nongpu": 3.0, "leak": 12.0, "gpu1": 5.0}
TARGET_OWN_SHARE_MS = 1.5
TARGET_OVER_GPU1_MS = {"gpu8": 1.0, "mig56": 1.0, "gpu1big": 1.0}
TARGET_PASSTHROUGH_MS = 0.7
# The gpuhook runtimes of a run: the dispatcher with the runtime service (the .deb's setup) and,
# with --compare-python, the same dispatcher whose config names no service (Python decides).
GPUHOOK = "gpuhook"
GPUHOOK_PYTHON = "gpuhook-python"
OURS = (GPUHOOK, GPUHOOK_PYTHON)
TARGET_CONCURRENT_P95_FACTOR = 3.0

K8S_ANNOTATIONS = {
    "io.kubernetes.cri.container-type": "container",
    "io.kubernetes.cri.container-name": "trainer",
    "io.kubernetes.cri.sandbox-id": "5f2d1c0b9a8e7d6c5b4a39281706f5e4d3c2b1a09f8e7d6c5b4a3928170",
    "io.kubernetes.cri.sandbox-name": "trainer-7d9f8c6b5-x2x4q",
    "io.kubernetes.cri.sandbox-namespace": "ml",
    "io.kubernetes.cri.sandbox-uid": "0b6c3e1a-6f0e-4c55-9a55-3f1b2a7c9d10",
    "io.kubernetes.cri.image-name": "registry.example/ml/trainer:1.0",
}


def case_spec_kwargs(case: str, node_b: dict[str, Any]) -> dict[str, Any]:
    if case == "nongpu":
        return {}
    if case == "leak":
        return {"env": ["NVIDIA_VISIBLE_DEVICES=all"], "annotations": K8S_ANNOTATIONS}
    if case in ("gpu1", "gpu1big"):
        return {"env": ["NVIDIA_VISIBLE_DEVICES=0"]}
    if case == "gpu8":
        return {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}
    if case == "mig56":
        last = node_b["gpus"][-1]["mig_devices"][-1]["uuid"]  # the last of the 56
        return {"env": [f"NVIDIA_VISIBLE_DEVICES={last}"]}
    raise ValueError(case)
