"""The node view's pure parts: a process's container from its cgroup, the join's verdicts, the
metrics' kinds and families, the listen address."""

from __future__ import annotations

import pytest

from gpuhook.errors import UsageError
from gpuhook.nodeview import join, metrics, probe, serve

CID = "4f1b" * 16
POD = "0d5c1e2a-7b3f-4c1d-9e8f-123456789abc"


@pytest.mark.parametrize(
    ("cgroup", "first"),
    [
        ("0::/gh-1234abcd\n", "gh-1234abcd"),  # runc's default, cgroup v2
        (f"12:memory:/{CID}\n0::/{CID}\n", CID),  # cgroupfs, v1 and v2 lines
        (f"0::/system.slice/docker-{CID}.scope\n", CID),
        (
            f"0::/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod"
            f"{POD.replace('-', '_')}.slice/cri-containerd-{CID}.scope\n",
            CID,
        ),
        (f"0::/kubepods/burstable/pod{POD}/{CID}\n", CID),
        (f"0::/machine.slice/libpod-{CID}.scope/container\n", "container"),
        (f"0::/kubepods.slice/crio-{CID}.scope\n", CID),
    ],
)
def test_the_cgroup_names_the_container(cgroup: str, first: str) -> None:
    ids = join.cgroup_ids(cgroup)
    assert ids[0] == first
    assert "gh-1234abcd" in ids or CID in ids  # libpod's nested "container" leaf: its parent


def test_the_pod_uid_of_a_kubelet_cgroup() -> None:
    systemd = f"0::/kubepods.slice/kubepods-pod{POD.replace('-', '_')}.slice/cri-containerd-x\n"
    assert join.pod_uid_of(systemd) == POD
    assert join.pod_uid_of(f"0::/kubepods/burstable/pod{POD}/{CID}\n") == POD
    assert join.pod_uid_of("0::/user.slice/user-0.slice/session-1.scope\n") == ""


GPU0 = join.Device("0", "GPU-0", "gpu", "H100", 80 << 30)
GPU1 = join.Device("1", "GPU-1", "gpu", "H100", 80 << 30)
MIG = join.Device("2:0", "MIG-20", "mig", "H100 MIG 3g.40gb", 40 << 30, "GPU-2")


def grant(cid: str, *devices: str, refused: bool = False, group: str = "") -> join.Grant:
    return join.Grant(
        cid, "ml", "trainer", "main", POD, "env", devices, refused, "why", 1.0, "running",
        group, 50 if group else None,
        tuple((d, 8 << 30) for d in devices) if group else (),
        tuple((d, 10 << 30) for d in devices) if group else (),
    )  # fmt: skip


def owner(pid: int, cid: str = "", *, in_container: bool = True, group: str = "") -> join.Owner:
    return join.Owner(pid, (cid,) if cid else (), in_container, "", f"cmd {pid}", group)


def verdicts(usage: join.NodeUsage) -> dict[tuple[str, int], tuple[str, bool, str]]:
    return {
        (d.device.id, u.pid): (u.owner, u.expected, u.container_id)
        for d in usage.devices
        for u in d.uses
    }


def test_the_join_judges_each_process() -> None:
    grants = [
        grant("granted", "GPU-0"),
        grant("whole", "GPU-2"),  # the MIG device's whole GPU
        grant("refused", refused=True),
        grant("client", "GPU-1", group="g1"),
    ]
    procs = [
        join.Process("GPU-0", "compute", 10, 1 << 20),
        join.Process("GPU-0", "compute", 11, 2 << 20),
        join.Process("GPU-1", "compute", 12, 0),
        join.Process("GPU-1", "mps", 13, 4 << 20),
        join.Process("GPU-0", "compute", 14, 0),
        join.Process("MIG-20", "compute", 15, 0),
        join.Process("MIG-20", "compute", 16, 0),
        join.Process("GPU-1", "compute", 17, 0),
        join.Process("GPU-0", "graphics", 18, 0),
    ]
    owners = {
        10: owner(10, "granted"),
        11: owner(11, "refused"),
        12: owner(12, group="g1", in_container=False),  # g1's MPS server
        13: owner(13, "client"),
        14: owner(14, "someone-else"),  # a container without a record
        15: owner(15, "whole"),
        16: owner(16, "client"),  # an MPS client on a device it was not granted
        17: owner(17, in_container=False),
        18: owner(18, group="g1", in_container=False),  # g1's server, off its GPUs
    }
    usage = join.join([GPU0, GPU1, MIG], grants, procs, owners, {"g1": ("GPU-1",)})
    assert verdicts(usage) == {
        ("0", 10): (join.CONTAINER, True, "granted"),
        ("0", 11): (join.CONTAINER, False, "refused"),
        ("1", 12): (join.MPS_SERVER, True, ""),
        ("1", 13): (join.CONTAINER, True, "client"),
        ("0", 14): (join.UNRECORDED, False, "someone-else"),
        ("2:0", 15): (join.CONTAINER, True, "whole"),
        ("2:0", 16): (join.CONTAINER, False, "client"),
        ("1", 17): (join.HOST, False, ""),
        ("0", 18): (join.HOST, False, ""),
    }
    held = {d.device.id: [g.container_id for g in d.grants] for d in usage.devices}
    assert held == {"0": ["granted"], "1": ["client"], "2:0": ["whole"]}  # never a refused one
    assert [(dev.id, u.pid) for dev, u in usage.mps_clients()["g1"]] == [("1", 13), ("2:0", 16)]
    view = usage.to_dict()
    assert [(u["device"], u["pid"]) for u in view["unexpected"]] == [
        ("0", 11), ("0", 14), ("0", 18), ("1", 17), ("2:0", 16)
    ]  # fmt: skip
    gpu1 = next(d for d in view["devices"] if d["id"] == "1")
    assert gpu1["granted"][0]["mps"] == {
        "group": "g1",
        "active_thread_percentage": 50,
        "pinned_memory_limit": 8 << 30,
        "reserved": 10 << 30,
    }
    assert gpu1["used_memory"] == 4 << 20


def test_a_pid_this_view_cannot_see_is_unexpected() -> None:
    usage = join.join([GPU0], [], [join.Process("GPU-0", "compute", 99, 0)], {}, {})
    (use,) = usage.devices[0].uses
    assert (use.owner, use.expected) == (join.UNSEEN, False)


@pytest.mark.parametrize(
    ("why", "kind"),
    [
        ("a pod sandbox never gets GPUs", "sandbox"),
        ("treated as a pod sandbox (no GPU): annotations disagree", "sandbox"),
        ("malformed GPU request: empty id", "malformed"),
        ("the request names no device", "no-device-named"),
        ("cannot verify against the kubelet checkpoint: no such file", "checkpoint-unreadable"),
        ("no GPU resource is allocated to pod ml/x container 'c' in the kubelet checkpoint",
         "not-allocated"),
        ("none of the requested devices is allocated to this container", "not-allocated"),
        ("env requests of Kubernetes containers are ignored (policy...: ignore)",
         "channel-ignored"),
        ("something new", "other"),
    ],
)  # fmt: skip
def test_refusal_kinds(why: str, kind: str) -> None:
    assert metrics.refusal_kind(why) == kind


def test_pod_families_add_up_per_pod_container_and_gpu() -> None:
    procs = [join.Process("GPU-0", "compute", p, 1 << 20) for p in (1, 2)]
    owners = {p: owner(p, "granted") for p in (1, 2)}
    usage = join.join([GPU0], [grant("granted", "GPU-0")], procs, owners, {})
    snap = probe.Snapshot(usage, (), ())
    families = {f.name: f for f in metrics.node_families(snap)}
    (sample,) = families["gpuhook_pod_gpu_memory_bytes"].samples
    assert sample.labels == {"namespace": "ml", "pod": "trainer", "container": "main", "gpu": "0"}
    assert sample.value == 2 << 20
    assert families["gpuhook_gpu_unexpected_users"].samples[0].value == 0


@pytest.mark.parametrize(
    ("value", "parsed"),
    [
        ("127.0.0.1:9479", ("127.0.0.1", 9479)),
        ("[::1]:9479", ("::1", 9479)),
        (":9479", ("0.0.0.0", 9479)),  # noqa: S104 (what ":PORT" asks for)
    ],
)
def test_listen_addresses(value: str, parsed: tuple[str, int]) -> None:
    assert serve.parse_listen(value) == parsed


@pytest.mark.parametrize("value", ["9479", "host:", "host:0", "host:70000", "host:http"])
def test_a_bad_listen_address_is_one_line(value: str) -> None:
    with pytest.raises(UsageError, match="is not HOST:PORT"):
        serve.parse_listen(value)
