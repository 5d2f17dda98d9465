"""Property-based fuzzing of every parser that reads input gpuhook did not write itself.

The spec parser and the request parser (config.json comes from the engine, its env and
annotations from image and pod authors), the whole decision pipeline on those specs, the kubelet
checkpoint reader, the config loader, the inventory reader and the OCI state parser (hooks read it
on stdin). Each is fed arbitrary bytes, arbitrary JSON/YAML and structured near-misses. The only
exception allowed out is one of gpuhook's own :class:`GpuhookError` subclasses, and its message is
one line: a traceback on the create path would be both a blocked container and an unreadable
error. ``GPUHOOK_FUZZ_EXAMPLES`` scales every test (CI runs the default: a few thousand cases in
total, in well under a minute).

Found by these tests and fixed (SECURITY.md, "Found and fixed"; regression tests in
test_hardening.py): a ``mounts`` that is not a list, and mount destinations or device paths that
are not strings, crashed the request parser and the edits; non-ASCII digits (``'\u00b2'``)
crashed device-id resolution; a damaged inventory crashed the inventory reader; YAML keys that
are not strings, invalid dates and deep nesting (a segfault in libyaml's C loader) crashed the
config loader.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any, TypedDict

import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from gpuhook import _fastjson, markers
from gpuhook.config import loading as config_loading
from gpuhook.errors import CheckpointError, ConfigError, GpuhookError, InventoryError, describe
from gpuhook.inventory import store
from gpuhook.pipeline import apply, kubelet, request
from gpuhook.pipeline.kubelet import Allocation
from gpuhook.runtime import decide, ocispec
from tests import factories as f

EXAMPLES = int(os.environ.get("GPUHOOK_FUZZ_EXAMPLES", "500"))


def fuzz(scale: float = 1.0) -> settings:
    return settings(
        max_examples=max(10, int(EXAMPLES * scale)),
        deadline=None,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


def one_line(exc: GpuhookError) -> None:
    code, message = describe(exc)
    assert "\n" not in message and message.strip() == message and message
    assert code in (1, 2)


# --- strategies -----------------------------------------------------------------------------------

UUIDS = [f.gpu_uuid(i) for i in range(8)] + [f.mig_uuid(6, m) for m in range(3)]
IDS = [
    "0",
    "7",
    "8",
    "all",
    "ALL",
    "none",
    "void",
    "",
    " 1 , 1 ",
    "all,0",
    "0,none",
    "6:1",
    "6:9",
    "0:0",
    "nvidia.com/gpu=1",
    "nvidia.com/gpu=all",
    "nvidia.com/mig=6:0",
    "amd.com/gpu=0",
    "vendor.com/x=../../etc",
    "../..",
    "GPU-nope",
    "MIG-GPU-x/1/0",
    "0\n1",
    ",".join(str(i % 9) for i in range(10_000)),
    *UUIDS,
    UUIDS[2].upper(),
    UUIDS[3] + "::2",
]
ids = st.sampled_from(IDS) | st.text(max_size=12)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**70), 2**70)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=12)
)
json_values = st.recursive(
    scalars,
    lambda kids: (
        st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=8), kids, max_size=4)
    ),
    max_leaves=20,
)


def maybe(strategy: Any) -> Any:
    """The expected shape most of the time (4 in 5), anything JSON otherwise."""
    return st.one_of(strategy, strategy, strategy, strategy, json_values)


env_entry = (
    st.builds(lambda v: f"NVIDIA_VISIBLE_DEVICES={v}", ids)
    | st.builds(
        lambda v: f"NVIDIA_DRIVER_CAPABILITIES={v}",
        st.sampled_from(["all", "compute", "compute,utility", "video,bogus", "", "ALL"]),
    )
    | st.sampled_from(["PATH=/bin", "LD_PRELOAD=/x.so", "NVIDIA_VISIBLE_DEVICES", "=x", ""])
    | st.text(max_size=10)
)
mount = st.fixed_dictionaries(
    {},
    optional={
        "destination": maybe(
            st.builds(
                lambda root, i: root + i,
                st.sampled_from([*request.MARKER_ROOTS, "/var/run/nvidia-container-devices"]),
                ids,
            )
        ),
        "source": maybe(st.sampled_from(["/dev/null", "/dev//null", "/tmp/empty-dir", "null"])),
        "type": maybe(st.sampled_from(["bind", "tmpfs"])),
        "options": maybe(st.lists(st.sampled_from(["ro", "bind", "rbind"]))),
    },
)
K8S_KEYS = [
    "io.kubernetes.cri.container-type",
    "io.kubernetes.cri.sandbox-uid",
    "io.kubernetes.cri.container-name",
    "io.kubernetes.pod.uid",
    "io.kubernetes.container.name",
    "io.kubernetes.cri-o.ContainerType",
    "io.kubernetes.cri-o.Annotations",
    "io.kubernetes.cri-o.Labels",
]
K8S_VALUES = [
    "sandbox",
    "container",
    "pod-uid-1",
    "main",
    "",
    "{}",
    '{"io.kubernetes.cri-o.ContainerType": "container"}',
    '{"io.kubernetes.pod.uid": "pod-uid-1"}',
    "[1]",
]
DOCKER_HOOK = {"path": "/usr/bin/nvidia-container-runtime-hook", "args": ["x", "prestart"]}
LEGACY_HOOK = {"path": "/usr/bin/nvidia-container-toolkit", "args": ["x", "prestart"]}
PODMAN_POD = {
    "io.kubernetes.cri-o.ContainerType": "container",
    "io.kubernetes.cri-o.SandboxID": "s",
}


@st.composite
def spec_dicts(draw: st.DrawFn) -> dict[str, Any]:
    """A spec that usually carries one or more GPU requests, through any channel, in any shape;
    some part of it is replaced by arbitrary JSON one time in three."""
    env = draw(st.lists(env_entry, max_size=3))
    if draw(st.booleans()):
        env.append(f"NVIDIA_VISIBLE_DEVICES={draw(ids)}")
    annotations: dict[str, Any] = {}
    ctype = st.sampled_from(["container", "container", "sandbox", "x"])
    engine = draw(st.integers(0, 4))
    if engine == 4:
        annotations.update(PODMAN_POD)
    elif engine == 1:
        annotations.update(f.k8s(ctype=draw(ctype)))
    elif engine == 2:
        copied = draw(st.sampled_from([{}, {"io.kubernetes.cri-o.ContainerType": "container"}]))
        annotations.update(f.crio(ctype=draw(ctype), copied=copied))
    for key in draw(st.lists(st.sampled_from([*K8S_KEYS, "gpuhook.io/x"]), max_size=2)):
        annotations[key] = draw(st.sampled_from(K8S_VALUES))
    for _ in range(draw(st.integers(0, 2))):
        annotations[f"cdi.k8s.io/{draw(st.text(max_size=4))}"] = draw(ids)
    mounts: list[Any] = []
    for _ in range(draw(st.integers(0, 2))):
        mounts.append(draw(mount))
    if draw(st.integers(0, 3)) == 0:  # a well-formed marker, as a device plugin (or a pod
        root = draw(st.sampled_from(request.MARKER_ROOTS))  # author with hostPath) mounts it
        mounts.append({"destination": root + draw(ids), "type": "bind", "source": "/dev/null"})
    for _ in range(draw(st.integers(0, 4)) // 3):  # the kubelet's per-pod mounts, now and then
        uid = draw(st.sampled_from(["pod-uid-1", "pod-uid-2"]))
        mounts.extend(f.kubelet_mounts(uid, draw(st.sampled_from(["main", "init"]))))
    if draw(st.booleans()):
        env.append("CUDA_VERSION=12.4.1")  # a legacy CUDA image, with NVIDIA's hook: all
    hook = draw(st.sampled_from([DOCKER_HOOK, LEGACY_HOOK, None, None, None, None]))
    hooks = {"prestart": [hook]} if hook else None
    power = draw(st.sampled_from(["privileged", "sys-admin", "", "", ""]))
    spec = f.spec(
        env=env,
        annotations=annotations,
        mounts=mounts,
        hooks=hooks,
        privileged=power == "privileged",
    )
    if power == "sys-admin":  # capabilities.add: [SYS_ADMIN]: not privileged
        spec["process"]["capabilities"]["bounding"].append("CAP_SYS_ADMIN")
    if draw(st.integers(0, 2)) == 0:  # damage one part of it
        where = draw(
            st.sampled_from(
                [
                    ("process",),
                    ("process", "env"),
                    ("process", "capabilities"),
                    ("process", "capabilities", "bounding"),
                    ("annotations",),
                    ("mounts",),
                    ("hooks",),
                    ("linux",),
                    ("linux", "resources"),
                    ("linux", "resources", "devices"),
                    ("root",),
                ]
            )
        )
        node = spec
        for key in where[:-1]:
            node = node.setdefault(key, {}) if isinstance(node.get(key), dict) else {}
        node[where[-1]] = draw(json_values)
    if draw(st.integers(0, 4)) == 0 and isinstance(spec.get("process"), dict):
        env_list = spec["process"].get("env")
        if isinstance(env_list, list):
            env_list.append(draw(json_values))
    return spec


allocations = st.lists(st.sampled_from([*UUIDS, "GPU-gone", "3"]), max_size=3)


def _dump(value: Any) -> bytes:
    return json.dumps(value).encode()


# --- the spec, the request, and the whole pipeline -----------------------------------------------

INVENTORY = f.inventory(8, {6: 3})


@fuzz(2)
@given(st.binary(max_size=300) | json_values.map(_dump) | spec_dicts().map(_dump))
def test_spec_and_request_parsers_raise_only_gpuhook_errors(raw: bytes) -> None:
    try:
        spec = ocispec.parse(raw, "/bundle")
        req = request.parse(spec)
    except GpuhookError as exc:
        one_line(exc)
        return
    if not markers.may_request_gpu(raw):  # the hot path's byte pre-check stays sound
        assert not req.channels


@fuzz(4)
@given(spec_dicts(), allocations, st.sampled_from(["verify", "trust", "ignore"]), st.booleans())
def test_pipeline_raises_only_gpuhook_errors_and_never_grants_beyond_policy(
    spec: dict[str, Any], allocated: list[str], k8s_mode: str, standalone_trust: bool
) -> None:
    """Every channel, every identity: the grant stays within :func:`most_granted`, an oracle
    written from the trust rules (docs/architecture.md, SECURITY.md) that shares no code with the
    policy or the resolver
    (it fails when the identity, marker or CDI verification rules are switched off)."""
    config = f.config(
        policy__kubernetes__env_requests=k8s_mode,
        policy__standalone__env_requests="trust" if standalone_trust else "ignore",
    )

    def checkpoint(_path: str, uid: str, name: str) -> Allocation:
        gpu = ("nvidia.com/gpu", tuple(allocated))
        return Allocation(uid, name, (gpu, ("nvidia.com/rdma_shared_device_a", ("0", "1"))), "cp")

    try:
        outcome = decide.run(
            spec, config, inventory_source=lambda _c: INVENTORY, checkpoint_source=checkpoint
        )
    except GpuhookError as exc:
        event(type(exc).__name__)
        one_line(exc)
        return
    decision = outcome.decision
    event(f"channel={decision.channel} granted={bool(decision.devices)}")
    ocispec.dumps(outcome.spec)  # what is written back is always valid JSON
    assert apply.apply(outcome.spec, outcome.edits) == outcome.spec  # idempotent
    bound = most_granted(spec, k8s_mode, standalone_trust, allocated)
    event(f"bound={'all' if bound == EVERY_DEVICE else len(bound)}")
    assert {d.uuid for d in decision.devices} <= bound
    if not bound:  # not even driver files
        assert not decision.injects
    if not decision.injects:  # nothing mounted, no device, no hook
        assert not outcome.edits.device_nodes and not outcome.edits.mounts
        assert not outcome.edits.hooks


# --- the oracle: what the trust rules allow at most, written from them ---------------------------

EVERY_DEVICE = frozenset(
    [g.uuid for g in INVENTORY.gpus] + [m.uuid for g in INVENTORY.gpus for m in g.mig_devices]
)
class Identity(TypedDict):
    """An engine's identity annotation keys."""

    type: str
    uid: str
    name: str
    others: tuple[str, ...]


CONTAINERD_IDENTITY: Identity = {
    "type": "io.kubernetes.cri.container-type",
    "uid": "io.kubernetes.cri.sandbox-uid",
    "name": "io.kubernetes.cri.container-name",
    "others": ("io.kubernetes.cri.sandbox-name", "io.kubernetes.cri.sandbox-namespace"),
}
CRIO_IDENTITY: Identity = {
    "type": "io.kubernetes.cri-o.ContainerType",
    "uid": "io.kubernetes.pod.uid",
    "name": "io.kubernetes.container.name",
    "others": ("io.kubernetes.pod.name", "io.kubernetes.pod.namespace"),
}
KUBELET_PODS = "/var/lib/kubelet/pods/"
MARKER_ROOTS = ("/var/run/nvidia-container-devices/", "/run/nvidia-container-devices/")


def most_granted(
    spec: dict[str, Any], mode: str, standalone_trust: bool, allocated: list[str]
) -> frozenset[str]:
    """The devices a spec may get at most, from the rules alone: CDI and markers are the device
    plugin's, docker's hook the engine's, env the image's; who is a Kubernetes container and
    whether it is one that may have GPUs at all; privileged means everything; under verify an
    unprivileged pod container gets at most its allocation, whatever the channel."""
    annotations = spec.get("annotations")
    annotations = {
        k: v for k, v in (annotations.items() if isinstance(annotations, dict) else ())
        if isinstance(k, str) and isinstance(v, str)
    }  # fmt: skip
    privileged = engine_privileged(spec)
    mounts = [m for m in spec.get("mounts") or () if isinstance(m, dict)] if isinstance(
        spec.get("mounts"), list) else []  # fmt: skip
    plugin = any(k.startswith("cdi.k8s.io/") for k in annotations) or any(
        isinstance(m.get("source"), str) and os.path.normpath(m["source"]) == "/dev/null"
        and isinstance(m.get("destination"), str)
        and m["destination"].startswith(MARKER_ROOTS)
        for m in mounts
    )  # fmt: skip
    hooks = spec.get("hooks")
    prestart = hooks.get("prestart") if isinstance(hooks, dict) else None
    docker = isinstance(prestart, list) and any(
        isinstance(h, dict) and isinstance(h.get("path"), str)
        and h["path"].rsplit("/", 1)[-1] in ("nvidia-container-runtime-hook",
                                            "nvidia-container-toolkit")
        for h in prestart
    )  # fmt: skip
    pod = pod_container(annotations, mounts)
    if pod is False:  # a sandbox, or an identity that cannot be trusted
        return frozenset()
    if pod is None:  # not Kubernetes
        return EVERY_DEVICE if privileged or plugin or docker or standalone_trust else frozenset()
    if privileged or mode == "trust" or (mode == "ignore" and plugin):
        return EVERY_DEVICE
    return allocated_devices(allocated) if mode == "verify" else frozenset()


def engine_privileged(spec: dict[str, Any]) -> bool:
    """What engines write for a privileged container: SYS_ADMIN, SYS_MODULE, SYS_RAWIO and
    NET_ADMIN among others in the bounding set, and the device cgroup left open to everything."""
    process = spec.get("process")
    process = process if isinstance(process, dict) else {}
    caps = process.get("capabilities")
    bounding = caps.get("bounding") if isinstance(caps, dict) else None
    wanted = {"CAP_SYS_ADMIN", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_NET_ADMIN"}
    if not isinstance(bounding, list) or not wanted <= {c for c in bounding if isinstance(c, str)}:
        return False
    linux = spec.get("linux")
    linux = linux if isinstance(linux, dict) else {}
    resources = linux.get("resources")
    resources = resources if isinstance(resources, dict) else {}
    rules = resources.get("devices")
    if not isinstance(rules, list) or not rules or not isinstance(rules[-1], dict):
        return False
    last = rules[-1]  # engines write the open rule last (or alone)
    return last.get("allow") is True and not {"type", "major", "minor"} & {
        k for k, v in last.items() if v not in (None, "", "a", -1)
    } and set(str(last.get("access") or "rwm")) >= set("rwm")


def pod_container(annotations: dict[str, str], mounts: list[dict[str, Any]]) -> bool | None:
    """None: no Kubernetes identity at all; True: a pod container; False: anything else."""
    podman_keys = {"io.kubernetes.cri-o.ContainerType", "io.kubernetes.cri-o.SandboxID",
                   "io.kubernetes.cri-o.Created", "io.kubernetes.cri-o.TTY"}  # fmt: skip
    ours = {k for k in annotations if k.startswith("io.kubernetes.")}
    podman = annotations.get("io.kubernetes.cri-o.ContainerType") == "container" and (
        ours <= podman_keys)  # fmt: skip
    if podman:
        annotations = {k: v for k, v in annotations.items() if k not in podman_keys}
    engines = [
        keys for keys in (CONTAINERD_IDENTITY, CRIO_IDENTITY)
        if any(k in annotations for k in (keys["type"], keys["uid"], keys["name"], *keys["others"]))
    ]  # fmt: skip
    sources = [os.path.normpath(m["source"]) for m in mounts if isinstance(m.get("source"), str)]
    kubelet = [s[len(KUBELET_PODS) :].split("/") for s in sources if s.startswith(KUBELET_PODS)]
    kubelet = [p for p in kubelet if p[0] and (p[1:] == ["etc-hosts"] or (
        len(p) == 4 and p[1] == "containers"))]  # fmt: skip
    if not engines and not kubelet:
        return None
    if len(engines) > 1:
        return False
    uids = {p[0] for p in kubelet}
    names = {p[2] for p in kubelet if len(p) == 4}
    if len(uids) > 1 or len(names) > 1:
        return False
    if not engines:
        return True
    keys = engines[0]
    if annotations.get(keys["type"]) != "container":
        return False
    if keys is CRIO_IDENTITY and not crio_keys_are_its_own(annotations):
        return False
    if uids and uids != {annotations.get(keys["uid"], "")}:
        return False
    return not names or names == {annotations.get(keys["name"], "")}


def crio_keys_are_its_own(annotations: dict[str, str]) -> bool:
    """CRI-O lists the pod annotations and labels it copied into the spec: none may be one of
    its identity keys (the kubelet's own labels excepted)."""
    try:
        copied = json.loads(annotations["io.kubernetes.cri-o.Annotations"])
        labels = json.loads(annotations.get("io.kubernetes.cri-o.Labels", "{}"))
    except (KeyError, ValueError):
        return False
    if not isinstance(copied, dict) or not isinstance(labels, dict):
        return False
    identity = {CRIO_IDENTITY["type"], CRIO_IDENTITY["uid"], CRIO_IDENTITY["name"],
                *CRIO_IDENTITY["others"]}  # fmt: skip
    return not (identity & set(copied)) and CRIO_IDENTITY["type"] not in labels


def allocated_devices(allocated: list[str]) -> frozenset[str]:
    """The fuzz allocation's GPU ids as device UUIDs: a UUID in any case, or a GPU's index (NVIDIA's
    device plugin's deviceIDStrategy: index, which resolves through the inventory as a UUID does);
    an unknown id: none, the create fails. The RDMA resource's ids are never devices."""
    by_name = {u.lower(): u for u in EVERY_DEVICE} | {str(g.index): g.uuid for g in INVENTORY.gpus}
    return frozenset(by_name[a.lower()] for a in allocated if a.lower() in by_name)


# --- the kubelet checkpoint -----------------------------------------------------------------------

entry = st.fixed_dictionaries(
    {},
    optional={
        "PodUID": maybe(st.sampled_from(["u", "v"])),
        "ContainerName": maybe(st.sampled_from(["c", "d"])),
        "ResourceName": maybe(st.sampled_from(["nvidia.com/gpu", "nvidia.com/mig-1g.10gb", "x"])),
        "DeviceIDs": maybe(
            st.lists(maybe(st.sampled_from(UUIDS)), max_size=3)
            | st.dictionaries(
                st.sampled_from(["0", "1"]),
                maybe(st.lists(maybe(st.sampled_from(UUIDS) | st.text(max_size=6)), max_size=3)),
            )
        ),
    },
)
checkpoints = st.fixed_dictionaries(
    {},
    optional={
        "Data": maybe(
            st.fixed_dictionaries(
                {}, optional={"PodDeviceEntries": maybe(st.lists(maybe(entry), max_size=4))}
            )
        ),
        "Checksum": json_values,
    },
)


@fuzz(2)
@given(st.binary(max_size=300) | json_values.map(_dump) | checkpoints.map(_dump))
def test_checkpoint_reader_raises_only_checkpoint_errors(raw: bytes) -> None:
    try:
        allocation = kubelet.allocation_from_bytes(raw, "/cp", "u", "c")
    except CheckpointError as exc:
        one_line(exc)
        return
    assert all(isinstance(r, str) for r, _ in allocation.resources)
    assert all(isinstance(i, str) for _, ids in allocation.resources for i in ids)


# --- the config loader ----------------------------------------------------------------------------

config_like = st.fixed_dictionaries(
    {},
    optional={
        "driver_root": maybe(st.sampled_from(["/", "/run/nvidia/driver", "rel"])),
        "log": maybe(st.fixed_dictionaries({}, optional={"level": maybe(st.just("debug"))})),
        "inject": maybe(
            st.fixed_dictionaries(
                {},
                optional={"default_capabilities": maybe(st.lists(st.sampled_from(["compute"])))},
            )
        ),
        "policy": maybe(
            st.fixed_dictionaries(
                {},
                optional={
                    "kubernetes": maybe(
                        st.fixed_dictionaries({}, optional={"env_requests": maybe(ids)})
                    )
                },
            )
        ),
    },
)
YAML_SNIPPETS = [
    "a: 2001-13-45\n",
    "2001-12-14: 1\n",
    "? [a]\n: 1\n",
    "? {a: 1}\n: 1\n",
    "? !!set {a}\n: 1\n",
    "{1: 2, 'a': 3}\n",
    "log: {1: 2}\n",
    "null: 1\n",
    "x: !!binary '@@'\n",
    "x: !!python/object/apply:os.system ['true']\n",
    "a: &a [*a]\n",
    "log: &a {x: *a}\n",
    "inject: &a {lib_dir: *a}\n",
    "[" * 5000,
    "- " * 5000,
    "{a: " * 5000,
    "[" * 60_000 + "]" * 60_000,
    "a: *unknown\n",
    "%YAML 9.9\n---\na: 1\n",
    "--- 1\n--- 2\n",
    "\ufeffdriver_root: /\n",
    "driver_root: !!float 1\n",
    "log:\n  file: relative\n",
]


def _load_config(raw: bytes) -> None:
    try:
        config_loading.validate_data("/c.yaml", config_loading.parse_yaml("/c.yaml", raw))
    except ConfigError as exc:
        one_line(exc)
        assert str(exc).startswith("invalid config /c.yaml: ")


@pytest.mark.parametrize("text", YAML_SNIPPETS)
def test_config_loader_known_nasties(text: str) -> None:
    _load_config(text.encode())


@fuzz(2)
@given(
    st.binary(max_size=200)
    | st.text(max_size=200).map(str.encode)
    | json_values.map(lambda v: yaml.safe_dump(v).encode())
    | config_like.map(lambda v: yaml.safe_dump(v).encode())
    | st.lists(st.sampled_from(YAML_SNIPPETS), min_size=1, max_size=3).map(
        lambda parts: "".join(p[:300] for p in parts).encode()
    )
)
def test_config_loader_raises_only_config_errors(raw: bytes) -> None:
    _load_config(raw)


# --- the inventory file and the OCI state on a hook's stdin ---------------------------------------


@pytest.fixture(scope="module")
def inventory_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("inv") / "inventory.json"


@fuzz(1)
@given(
    raw=st.binary(max_size=200)
    | json_values.map(_dump)
    | st.builds(
        lambda d, k, v: _dump({**d, k: v}),
        st.just(INVENTORY.to_dict()),
        st.sampled_from(list(INVENTORY.to_dict())),
        json_values,
    )
)
def test_inventory_reader_raises_only_inventory_errors(inventory_file: Path, raw: bytes) -> None:
    inventory_file.write_bytes(raw)
    config = f.config(inventory__path=str(inventory_file))
    try:
        store.read(config)
    except InventoryError as exc:
        one_line(exc)


@fuzz(1)
@given(
    st.binary(max_size=200)
    | json_values.map(_dump)
    | st.fixed_dictionaries({"bundle": maybe(st.text(max_size=10))}, optional={"id": scalars}).map(
        _dump
    )
)
def test_oci_state_parser_raises_only_spec_errors(raw: bytes) -> None:
    try:
        state = ocispec.parse_state(raw)
    except GpuhookError as exc:
        one_line(exc)
        return
    assert isinstance(state["bundle"], str)


def test_deep_json_is_one_line() -> None:
    for raw in (b"[" * 200_000, b"[" * 100_000 + b"]" * 100_000, b'{"a":' * 100_000):
        with pytest.raises(GpuhookError) as info:
            request.parse(ocispec.parse(raw, "/b"))
        one_line(info.value)
    deep: Any = "x"
    for _ in range(100_000):
        deep = [deep]
    with pytest.raises(GpuhookError):
        ocispec.dumps({"a": deep})
    with pytest.raises(ValueError):
        _fastjson.dumps(deep)
