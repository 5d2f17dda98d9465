"""MPS sharing as pure data: share groups from the config, the limits a container gets and where
each came from, refusals (one line each), and the pipeline's MPS edits."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhook.config import loading as config_loading
from gpuhook.config import units
from gpuhook.errors import ConfigError, MpsError, RequestError, UsageError
from gpuhook.model.decision import KIND_GPU, KIND_MIG, Decision, DeviceRef
from gpuhook.mps import daemons
from gpuhook.pipeline import apply, flow, identity, request, sharing
from gpuhook.runtime import decide
from tests import factories as f
from tests.imports import loaded

INV = f.inventory(8, {6: 3})
GIB = 1 << 30
MEM = 80 * GIB  # factories' GPU memory
UUIDS = [f.gpu_uuid(i) for i in range(8)]


def cfg(**mps: Any) -> Any:
    return f.config(**{f"mps__{k}": v for k, v in mps.items()})


def groups(**mps: Any) -> tuple[sharing.Group, ...]:
    config = cfg(**mps)
    return sharing.resolve_groups(config.mps, INV, "cfg.yaml")


def grant(*indices: int) -> Decision:
    refs = tuple(DeviceRef(KIND_GPU, UUIDS[i], i) for i in sorted(indices))
    return Decision(gpu_container=True, devices=refs, capabilities=("compute",))


def plan(
    decision: Decision, annotations: dict[str, str] | None = None, **mps: Any
) -> sharing.MpsPlan | None:
    config = cfg(**mps)
    req = request.parse(f.spec(annotations=annotations))
    return sharing.plan(decision, INV, config.mps, "cfg.yaml", req)


def refusal(decision: Decision, annotations: dict[str, str] | None = None, **mps: Any) -> str:
    with pytest.raises(RequestError) as info:
        plan(decision, annotations, **mps)
    line = str(info.value)
    assert "\n" not in line
    return line


# --- values -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("512M", 512 << 20),
        ("20G", 20 * GIB),
        ("20GB", 20 * GIB),
        ("20GiB", 20 * GIB),
        ("1.5g", 3 * GIB // 2),
        (" 2T ", 2 << 40),
        ("1024k", 1 << 20),
    ],
)
def test_parse_size(text: str, expected: int) -> None:
    assert units.parse_size(text) == expected


@pytest.mark.parametrize("text", ["8X", "", "10", "G", "1.2.3G", "-1G", "0M", "512K", "1e3M", 12])
def test_parse_size_refuses(text: object) -> None:
    with pytest.raises(ValueError, match=r"is not a size|less than 1M"):
        units.parse_size(text)


@pytest.mark.parametrize(
    ("gpu_id", "problem"),
    [
        ("0", ""),
        ("all", ""),
        ("GPU-1234", ""),
        ("MIG-1234", "MIG devices cannot be MPS-shared"),
        ("MIG-GPU-1234/1/0", "MIG devices cannot be MPS-shared"),
        ("1:0", "MIG devices cannot be MPS-shared"),
        ("nvidia.com/gpu=0", "is not a GPU index, a GPU UUID (GPU-...) or all"),
    ],
)
def test_check_gpu_id(gpu_id: str, problem: str) -> None:
    assert (problem in config_loading.check_gpu_id(gpu_id)) and bool(problem) == bool(
        config_loading.check_gpu_id(gpu_id)
    )


# --- groups -------------------------------------------------------------------------------------


def test_every_shared_gpu_is_its_own_group_by_default() -> None:
    gs = groups(gpus=["3", "1", UUIDS[5]])
    assert [(g.name, g.indices) for g in gs] == [("gpu1", "1"), ("gpu3", "3"), ("gpu5", "5")]
    assert gs[0].visible_devices() == UUIDS[1]
    assert gs[0].pipe_dir("/run/gpuhook/mps") == "/run/gpuhook/mps/gpu1/pipe"
    assert gs[0].log_dir("/run/gpuhook/mps/") == "/run/gpuhook/mps/gpu1/log"
    assert gs[0].percentage == sharing.Share(None, "no share configured")
    assert gs[0].default_commands() == []


def test_all_skips_mig_gpus_and_groups_take_their_gpus() -> None:
    gs = groups(gpus=["all"], groups={"pair": {"gpus": [3, 0]}})
    assert [(g.name, g.indices) for g in gs] == [
        ("pair", "0,3"),
        ("gpu1", "1"),
        ("gpu2", "2"),
        ("gpu4", "4"),
        ("gpu5", "5"),
        ("gpu7", "7"),
    ]
    pair = gs[0]
    assert pair.visible_devices() == f"{UUIDS[0]},{UUIDS[3]}"  # index order: the clients' order


def test_replicas_give_the_share_and_the_daemon_defaults() -> None:
    (g,) = groups(gpus=[0], replicas=4)
    assert g.percentage == sharing.Share(25, "100/4 from mps.replicas")
    assert g.pinned == (sharing.Share(20 * GIB, "1/4 of 80G from mps.replicas"),)
    assert g.default_commands() == [
        "set_default_active_thread_percentage 25",
        "set_default_device_pinned_mem_limit 0 20480M",
    ]


def test_explicit_values_win_over_replicas_and_groups_over_the_top_level() -> None:
    gs = groups(
        gpus=[1],
        replicas=4,
        pinned_memory_limit="10G",
        groups={
            "pair": {"gpus": [0, 3], "replicas": 2},
            "solo": {"gpus": [2], "active_thread_percentage": 70},
        },
    )
    pair, gpu1, solo = gs
    assert pair.percentage == sharing.Share(50, "100/2 from mps.groups.pair.replicas")
    assert [s.value for s in pair.pinned] == [40 * GIB, 40 * GIB]
    assert pair.default_commands() == [
        "set_default_active_thread_percentage 50",
        "set_default_device_pinned_mem_limit 0 40960M",
        "set_default_device_pinned_mem_limit 1 40960M",
    ]
    assert gpu1.percentage.value == 25
    assert gpu1.pinned == (sharing.Share(10 * GIB, "mps.pinned_memory_limit"),)
    assert solo.percentage == sharing.Share(70, "mps.groups.solo.active_thread_percentage")
    assert solo.pinned == (sharing.Share(10 * GIB, "mps.pinned_memory_limit"),)


@pytest.mark.parametrize(
    ("mps", "message"),
    [
        ({"gpus": [6]}, "mps.gpus[0]: GPU 6 (" + f.gpu_uuid(6) + ") is in MIG mode; MIG devices"),
        ({"gpus": [0, 9]}, "mps.gpus[1]: no GPU 9 on this node (GPUs 0,1,2,3,4,5,6,7)"),
        (
            {"groups": {"a": {"gpus": [0]}, "b": {"gpus": [UUIDS[0]]}}},
            "mps.groups.b.gpus[0]: GPU 0 is already in group a",
        ),
        ({"gpus": [0], "pinned_memory_limit": "100G"}, "mps.pinned_memory_limit: 100G is more"),
    ],
)
def test_config_that_does_not_fit_the_node(mps: dict[str, Any], message: str) -> None:
    with pytest.raises(ConfigError) as info:
        groups(**mps)
    assert message in str(info.value) and str(info.value).startswith("invalid config cfg.yaml: ")


def test_select_groups_by_name_index_or_uuid() -> None:
    gs = groups(gpus=[1, 2], groups={"pair": {"gpus": [0, 3]}})
    pick = daemons.select_groups
    assert [g.name for g in pick(gs, ())] == ["pair", "gpu1", "gpu2"]
    assert [g.name for g in pick(gs, ("3", "gpu2"))] == ["pair", "gpu2"]
    assert [g.name for g in pick(gs, (UUIDS[1].upper(),))] == ["gpu1"]
    with pytest.raises(UsageError, match=r"'5' is not an MPS-shared GPU or share group"):
        pick(gs, ("5",))


# --- what a container gets ----------------------------------------------------------------------


def test_not_shared_gets_no_plan() -> None:
    assert plan(grant(1), gpus=[0]) is None
    assert plan(Decision(gpu_container=True, driver_only=True), gpus=[0]) is None


def test_a_utility_only_container_is_no_mps_client() -> None:
    """A GPU monitor (NVIDIA_DRIVER_CAPABILITIES=utility) granted every GPU runs no CUDA, so it
    is neither refused for mixing shared and unshared GPUs nor given MPS limits."""
    monitor = grant(0, 1, 2).replace(capabilities=("utility",))
    assert plan(monitor, gpus=[0]) is None
    out = run(
        f.spec(env=["NVIDIA_VISIBLE_DEVICES=all", "NVIDIA_DRIVER_CAPABILITIES=utility"]),
        probe=None,
        gpus=[0],
    )
    assert out.mps is None and len(out.decision.devices) == 8


def test_single_gpu_with_the_configured_share() -> None:
    p = plan(grant(2), gpus=[2], replicas=4)
    assert p is not None
    assert p.env() == (
        "CUDA_MPS_PIPE_DIRECTORY=/run/gpuhook/mps/pipe",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=20480M",
    )
    assert [(m.host_path, m.container_path, m.options) for m in p.mounts()] == [
        (
            "/run/gpuhook/mps/gpu2/pipe",
            "/run/gpuhook/mps/pipe",
            ("nosuid", "nodev", "noexec", "bind"),
        )
    ]
    d = p.to_dict()
    assert d["active_thread_percentage"] == {"value": 25, "source": "100/4 from mps.replicas"}
    assert d["pinned_memory_limits"] == [
        {
            "index": 0,
            "gpu": 2,
            "uuid": UUIDS[2],
            "bytes": 20 * GIB,
            "limit": "20480M",
            "source": "1/4 of 80G from mps.replicas",
            "reserved": 20 * GIB,
        }
    ]
    assert d["client_uid"] == 0
    assert d["per_process"].startswith("MPS applies these limits to each CUDA process")


def test_no_share_means_the_whole_gpu_and_reserves_nothing() -> None:
    p = plan(grant(0), gpus=[0])
    assert p is not None
    assert p.percentage == 100 and p.percentage_source == "no share configured"
    assert p.devices[0].pinned == MEM and p.devices[0].reserved == 0
    assert p.pinned_value == "0=81920M"
    lowered = plan(grant(0), {sharing.ANN_PINNED: "8G"}, gpus=[0])
    assert lowered is not None and lowered.devices[0].reserved == 0  # nothing enforces it


def test_annotations_lower_the_share_and_say_so() -> None:
    p = plan(
        grant(0),
        {sharing.ANN_PERCENTAGE: "20", sharing.ANN_PINNED: "8G"},
        gpus=[0],
        replicas=2,
    )
    assert p is not None
    assert (p.percentage, p.percentage_source) == (20, f"annotation {sharing.ANN_PERCENTAGE}")
    assert (p.devices[0].pinned, p.devices[0].source) == (
        8 * GIB,
        f"annotation {sharing.ANN_PINNED}",
    )
    # a process may raise its own limit up to the daemon's default: the share is reserved
    assert p.devices[0].reserved == 40 * GIB
    other = plan(grant(0), {sharing.ANN_PERCENTAGE: "40"}, gpus=[0], replicas=2)
    assert other is not None and other.percentage == 40 and other.devices[0].pinned == 40 * GIB


def test_a_group_of_gpus_0_and_3_gets_container_indices_0_and_1() -> None:
    p = plan(
        grant(0, 3),
        {sharing.ANN_PINNED: "1=10G"},
        groups={"pair": {"gpus": [3, 0]}},
        pinned_memory_limit="30G",
    )
    assert p is not None and p.group == "pair"
    assert p.pipe_dir == "/run/gpuhook/mps/pair/pipe"
    assert p.pinned_value == "0=30720M,1=10240M"
    assert [(d.container_index, d.gpu_index) for d in p.devices] == [(0, 0), (1, 3)]


def test_log_dir_and_shm_when_configured() -> None:
    p = plan(grant(1), gpus=[1], log_dir=True, shm="/dev/shm", root="/srv/mps")
    assert p is not None
    assert "CUDA_MPS_LOG_DIRECTORY=/run/gpuhook/mps/log" in p.env()
    assert [(m.host_path, m.container_path, m.options[0]) for m in p.mounts()] == [
        ("/srv/mps/gpu1/pipe", "/run/gpuhook/mps/pipe", "nosuid"),
        ("/srv/mps/gpu1/log", "/run/gpuhook/mps/log", "ro"),
        ("/srv/mps/gpu1/shm", "/dev/shm", "nosuid"),  # the group's own, never the host's
    ]
    assert p.replace_mounts() == ("/dev/shm",)
    q = plan(grant(1), gpus=[1], shm="group", root="/srv/mps")
    assert q is not None and q.mounts()[-1].host_path == "/srv/mps/gpu1/shm"


@pytest.mark.parametrize(
    ("annotations", "message"),
    [
        ({sharing.ANN_PERCENTAGE: "0"}, "'0' is not a percentage from 1 to 100"),
        ({sharing.ANN_PERCENTAGE: "101"}, "'101' is not a percentage from 1 to 100"),
        ({sharing.ANN_PERCENTAGE: "50%"}, "'50%' is not a percentage from 1 to 100"),
        ({sharing.ANN_PERCENTAGE: "60"}, "60 is more than the share of MPS group gpu0 (50, 100/2"),
        ({sharing.ANN_PINNED: "8X"}, "'8X' is not a size"),
        ({sharing.ANN_PINNED: "0=8G,0=4G"}, "device index 0 is given twice"),
        ({sharing.ANN_PINNED: "1=8G"}, "device index 1 is not one of the container's MPS devices"),
        ({sharing.ANN_PINNED: "x=8G"}, "'x=8G' is not <device index>=<size>"),
        ({sharing.ANN_PINNED: "41G"}, "41G for device 0 is more than the share of GPU 0 (40G"),
    ],
)
def test_bad_annotations_are_refused_in_one_line(annotations: dict[str, str], message: str) -> None:
    line = refusal(grant(0), annotations, gpus=[0], replicas=2)
    assert message in line, line
    assert line.startswith("annotation gpuhook.io/mps-")


def test_pinned_annotation_over_the_gpu_memory() -> None:
    line = refusal(grant(0), {sharing.ANN_PINNED: "81G"}, gpus=[0])
    assert line == (
        f"annotation {sharing.ANN_PINNED}: 81G for device 0 is more than the memory of GPU 0 (80G)"
    )


def test_grants_one_daemon_cannot_serve() -> None:
    assert "are MPS-shared by different control daemons (groups gpu0, gpu3)" in refusal(
        grant(0, 3), gpus=[0, 3]
    )
    assert "GPU 0 is MPS-shared (group gpu0) but GPU 1 is not" in refusal(grant(0, 1), gpus=[0])
    mig = Decision(
        gpu_container=True,
        devices=(
            DeviceRef(KIND_GPU, UUIDS[0], 0),
            DeviceRef(KIND_MIG, f.mig_uuid(6, 0), 6, 0),
        ),
        capabilities=("compute", "utility"),
    )
    assert "but MIG device 6:0 is not" in refusal(mig, gpus=[0])
    assert "request all of GPUs 0,3, or give GPU 3 its own group" in refusal(
        grant(3), groups={"pair": {"gpus": [0, 3]}}
    )


# --- through the pipeline -----------------------------------------------------------------------


def run(
    spec: dict[str, Any],
    probe: int | None = 4242,
    admitted: list[sharing.MpsPlan] | None = None,
    **mps: Any,
) -> flow.Outcome:
    return decide.run(
        spec,
        cfg(**mps),
        inventory_source=lambda _c: INV,
        mps_probe=lambda _pipe: probe,
        mps_admit=(admitted if admitted is not None else []).append,
    )


def env_of(spec: dict[str, Any]) -> dict[str, str]:
    return dict(e.split("=", 1) for e in spec["process"]["env"])


def test_pipeline_injects_mps_and_replaces_the_images_values() -> None:
    image_env = [
        "NVIDIA_VISIBLE_DEVICES=1",
        "CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=100",
        "CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0=80G",
        "CUDA_MPS_PIPE_DIRECTORY=/tmp/elsewhere",
    ]
    out = run(f.spec(env=image_env), gpus=[1], replicas=2, shm="/dev/shm")
    env = env_of(out.spec)
    assert env["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] == "50"
    assert env["CUDA_MPS_PINNED_DEVICE_MEM_LIMIT"] == "0=40960M"
    assert env["CUDA_MPS_PIPE_DIRECTORY"] == "/run/gpuhook/mps/pipe"
    assert sum(e.startswith("CUDA_MPS_PIPE_DIRECTORY=") for e in out.spec["process"]["env"]) == 1
    mounts = {m["destination"]: m for m in out.spec["mounts"]}
    assert mounts["/run/gpuhook/mps/pipe"]["source"] == "/run/gpuhook/mps/gpu1/pipe"
    assert out.mps is not None and out.edits.replace_mounts == ("/dev/shm",)
    assert apply.apply(out.spec, out.edits) == out.spec  # idempotent


def test_shm_replaces_the_containers_own_dev_shm() -> None:
    spec = f.spec(env=["NVIDIA_VISIBLE_DEVICES=0"])
    spec["mounts"].append({"destination": "/dev/shm", "type": "tmpfs", "source": "shm"})
    spec["mounts"].append({"destination": "/data", "type": "bind", "source": "/srv/data"})
    out = run(spec, gpus=[0], shm="/dev/shm")
    shm = [m for m in out.spec["mounts"] if m["destination"] == "/dev/shm"]
    assert shm == [
        {
            "destination": "/dev/shm",
            "type": "bind",
            "source": "/run/gpuhook/mps/gpu0/shm",
            "options": ["nosuid", "nodev", "noexec", "bind"],
        }
    ]
    assert {"destination": "/data", "type": "bind", "source": "/srv/data"} in out.spec["mounts"]
    without = run(spec, gpus=[0])
    assert {"destination": "/dev/shm", "type": "tmpfs", "source": "shm"} in without.spec["mounts"]


def test_pipeline_refuses_when_the_daemon_is_down() -> None:
    with pytest.raises(MpsError) as info:
        run(f.spec(env=["NVIDIA_VISIBLE_DEVICES=0,3"]), probe=None, groups={"p": {"gpus": [0, 3]}})
    assert str(info.value) == (
        "the MPS control daemon of GPUs 0,3 (group p) is not running; start it: gpuhook mps start p"
    )


def test_pipeline_admits_the_plan_with_the_clients_host_uid() -> None:
    admitted: list[sharing.MpsPlan] = []
    spec = f.spec(env=["NVIDIA_VISIBLE_DEVICES=0"])
    spec["process"]["user"] = {"uid": 1000, "gid": 1000, "additionalGids": [44]}
    run(spec, admitted=admitted, gpus=[0], replicas=2)
    (p,) = admitted
    assert (p.client.uid, p.client.gids) == (1000, (44, 1000))
    assert p.to_dict()["client_uid"] == 1000
    with pytest.raises(RequestError, match="too full"):

        def refuse(_plan: sharing.MpsPlan) -> None:
            raise RequestError("too full")

        decide.run(
            spec,
            cfg(gpus=[0]),
            inventory_source=lambda _c: INV,
            mps_probe=lambda _p: 1,
            mps_admit=refuse,
        )


@pytest.mark.parametrize(
    ("linux", "expected"),
    [
        ({}, (1000, (1000,))),
        (
            {
                "namespaces": [{"type": "user"}],
                "uidMappings": [{"containerID": 0, "hostID": 100000, "size": 65536}],
                "gidMappings": [{"containerID": 0, "hostID": 200000, "size": 65536}],
            },
            (101000, (201000,)),
        ),
        ({"namespaces": [{"type": "user", "path": "/proc/1/ns/user"}]}, (None, ())),
        (
            {
                "namespaces": [{"type": "user"}],
                "uidMappings": [{"containerID": 0, "hostID": 5000, "size": 1}],
            },
            (None, ()),
        ),
    ],
)
def test_the_client_uid_is_the_hosts(linux: dict[str, Any], expected: tuple[Any, Any]) -> None:
    spec = f.spec()
    spec["process"]["user"] = {"uid": 1000, "gid": 1000}
    spec["linux"] = {**spec.get("linux", {}), **linux}
    client = identity.client_of(spec)
    assert (client.uid, client.gids) == expected
    assert identity.client_of({}) == identity.ROOT_CLIENT


def test_non_mps_gpu_containers_are_untouched_by_mps() -> None:
    out = run(f.spec(env=["NVIDIA_VISIBLE_DEVICES=2"]), probe=None, gpus=[0])
    assert out.mps is None
    assert not any(e.startswith("CUDA_MPS_") for e in out.spec["process"]["env"])


def test_the_mps_create_path_imports_nothing_heavy() -> None:
    heavy = {"typing", "dataclasses", "re", "pathlib", "json", "subprocess", "tempfile", "copy"}
    heavy |= {"contextlib", "yaml", "jsonschema", "structlog", "click", "pynvml"}
    assert (
        loaded(
            "from gpuhook.pipeline import flow, sharing; "
            "from gpuhook.mps import admission, daemons; from gpuhook.records import writer",
            heavy,
        )
        == []
    )
