"""tools/fake-node: the fake GPU node is what it claims in node.json, through real mechanisms
(ELF sonames, ld.so.cache, mknod nodes, pynvml loading the fake libnvidia-ml.so.1)."""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import stat
import subprocess
import sys
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

pytestmark = pytest.mark.root

REPO = Path(__file__).resolve().parents[2]
TOOL = REPO / "tools" / "fake-node"
VENV_PYTHON = REPO / ".venv" / "bin" / "python"
PYTHON = str(VENV_PYTHON) if VENV_PYTHON.exists() else sys.executable
LIBDIR = "/usr/lib/x86_64-linux-gnu"

PROBE = r"""
import json, pynvml as n
n.nvmlInit()
out = {"driver": n.nvmlSystemGetDriverVersion(), "cuda": n.nvmlSystemGetCudaDriverVersion(),
       "cuda_v2": n.nvmlSystemGetCudaDriverVersion_v2(), "nvml": n.nvmlSystemGetNVMLVersion(),
       "gpus": []}
for i in range(n.nvmlDeviceGetCount()):
    h = n.nvmlDeviceGetHandleByIndex(i)
    cur, pend = n.nvmlDeviceGetMigMode(h)
    g = {"index": n.nvmlDeviceGetIndex(h), "uuid": n.nvmlDeviceGetUUID(h),
         "minor": n.nvmlDeviceGetMinorNumber(h), "name": n.nvmlDeviceGetName(h),
         "memory": n.nvmlDeviceGetMemoryInfo(h).total,
         "memory_v2": n.nvmlDeviceGetMemoryInfo(h, n.nvmlMemory_v2).total,
         "pci_bus_id": n.nvmlDeviceGetPciInfo(h).busId,
         "cc": "%d.%d" % n.nvmlDeviceGetCudaComputeCapability(h),
         "mig": [cur, pend], "max_mig": n.nvmlDeviceGetMaxMigDeviceCount(h),
         "is_mig": n.nvmlDeviceIsMigDeviceHandle(h).value,
         "by_uuid": n.nvmlDeviceGetIndex(n.nvmlDeviceGetHandleByUUID(n.nvmlDeviceGetUUID(h))),
         "persistence": n.nvmlDeviceGetPersistenceMode(h), "migs": []}
    for slot in range(g["max_mig"]):
        try:
            m = n.nvmlDeviceGetMigDeviceHandleByIndex(h, slot)
        except n.NVMLError_NotFound:
            continue
        parent = n.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(m)
        g["migs"].append({"index": slot, "uuid": n.nvmlDeviceGetUUID(m),
                          "gi": n.nvmlDeviceGetGpuInstanceId(m),
                          "ci": n.nvmlDeviceGetComputeInstanceId(m),
                          "name": n.nvmlDeviceGetName(m),
                          "memory": n.nvmlDeviceGetMemoryInfo(m).total,
                          "is_mig": n.nvmlDeviceIsMigDeviceHandle(m).value,
                          "parent": n.nvmlDeviceGetUUID(parent)})
    out["gpus"].append(g)
try:
    n.nvmlDeviceGetGpuInstanceId(n.nvmlDeviceGetHandleByIndex(0))
    out["gi_on_gpu"] = "ok"
except n.NVMLError as e:
    out["gi_on_gpu"] = str(e)
except Exception:
    out["gi_on_gpu"] = "no gpu"
n.nvmlShutdown()
try:
    n.nvmlDeviceGetCount()
    out["after_shutdown"] = "ok"
except n.NVMLError as e:
    out["after_shutdown"] = str(e)
print(json.dumps(out))
"""


@dataclass
class Built:
    root: Path
    truth: dict[str, Any]
    env: dict[str, str]
    stdout: str


def run_tool(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["/usr/bin/python3", str(TOOL), str(root), *args],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
    )


def build(root: Path, *args: str) -> Built:
    out = run_tool(root, *args)
    assert out.returncode == 0, out.stderr
    env = {}
    for line in out.stdout.splitlines():
        assert line.startswith("export "), line
        key, _, value = line.removeprefix("export ").partition("=")
        env[key] = shlex.split(value)[0]
    return Built(root, json.loads((root / "node.json").read_text()), env, out.stdout)


def nvml_env(b: Built, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("FAKE_NVML_DATA", "LD_LIBRARY_PATH")}
    return {**env, "LD_LIBRARY_PATH": b.env["LD_LIBRARY_PATH"], **extra}


def probe(b: Built, **extra: str) -> dict[str, Any]:
    out = subprocess.run(
        [PYTHON, "-c", PROBE],
        capture_output=True,
        text=True,
        check=False,
        env=nvml_env(b, **extra),
        timeout=60,
    )
    assert out.returncode == 0, out.stderr
    result: dict[str, Any] = json.loads(out.stdout)
    return result


def host_has_nvml() -> bool:
    out = subprocess.run(["/sbin/ldconfig", "-p"], capture_output=True, text=True, check=False)
    return "libnvidia-ml.so.1" in out.stdout


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    return build(tmp_path_factory.mktemp("fake") / "node", "--mig-gpus", "1,2")


@pytest.fixture
def removed(built: Built) -> Iterator[list[Path]]:
    """Device nodes a test removes; put back afterwards exactly as they were."""
    gone: list[Path] = []
    yield gone
    for path in gone:
        for n in _all_nodes(built.truth):
            if n["host_path"] == str(path) and not path.exists():
                os.mknod(path, stat.S_IFCHR | n["mode"], os.makedev(n["major"], n["minor"]))
                os.chmod(path, n["mode"])


def _all_nodes(truth: dict[str, Any]) -> list[dict[str, Any]]:
    nodes = [g["device_node"] for g in truth["gpus"]] + list(truth["control_nodes"])
    nodes += list(truth["mig_caps"].values())
    nodes += [c for g in truth["gpus"] for m in g["mig_devices"] for c in m["caps_nodes"]]
    return nodes


def test_stdout_is_exports_and_truth_matches_options(built: Built) -> None:
    t = built.truth
    root = str(built.root)
    assert built.env == {
        "GPUHOOK_CONFIG": f"{root}/config.yaml",
        "GPUHOOK_CACHE_DIR": f"{root}/run/config",
        "LD_LIBRARY_PATH": f"{root}/driver{LIBDIR}",
    }
    assert t["env"] == built.env
    assert (t["driver_version"], t["cuda_version"], t["cuda_version_string"]) == (
        "550.54.15",
        12040,
        "12.4",
    )
    assert [g["index"] for g in t["gpus"]] == list(range(8))
    assert [g["minor"] for g in t["gpus"]] == list(range(8))
    assert len({g["uuid"] for g in t["gpus"]}) == 8
    assert len({g["pci_bus_id"] for g in t["gpus"]}) == 8
    for g in t["gpus"]:
        assert re.fullmatch(r"GPU-[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}", g["uuid"])
        assert re.fullmatch(r"[0-9A-F]{8}:[0-9A-F]{2}:00\.0", g["pci_bus_id"])
        assert (g["name"], g["memory"], g["compute_capability"]) == (
            "NVIDIA H100 80GB HBM3",
            85520809984,
            "9.0",
        )
        assert g["mig_enabled"] == (g["index"] in (1, 2))
        assert len(g["mig_devices"]) == (3 if g["mig_enabled"] else 0)
        for m in g["mig_devices"]:
            assert re.fullmatch(r"MIG-[0-9a-f]{8}-([0-9a-f]{4}-){3}[0-9a-f]{12}", m["uuid"])
            assert m["name"] == f"NVIDIA H100 80GB HBM3 MIG {m['profile']}"
            assert 0 < m["memory"] < g["memory"]
            gi_minor = 3 + (g["minor"] * 15 + m["gi_id"]) * 9
            assert m["caps_minors"] == [gi_minor, gi_minor + 1 + m["ci_id"]]
    assert [m["gi_id"] for m in t["gpus"][1]["mig_devices"]] == [2, 3, 9]
    assert t["absent_libraries"] == [
        "libnvidia-nscq.so",
        "libnvidia-fatbinaryloader.so",
        "libnvidia-compiler.so",
        "libnvidia-ifr.so",
    ]
    # UUIDs depend only on the index, not on the folder
    other = build(built.root.parent / "other", "--gpus", "2", "--no-ldcache")
    assert [g["uuid"] for g in other.truth["gpus"]] == [g["uuid"] for g in t["gpus"][:2]]


def test_device_nodes_are_real(built: Built) -> None:
    t = built.truth
    assert t["gpu_major"] == 195
    assert t["uvm_major"] != t["caps_major"]
    names = {n["path"]: n for n in t["control_nodes"]}
    assert (names["/dev/nvidiactl"]["major"], names["/dev/nvidiactl"]["minor"]) == (195, 255)
    assert (names["/dev/nvidia-modeset"]["minor"], names["/dev/nvidia-uvm-tools"]["minor"]) == (
        254,
        1,
    )
    nodes = _all_nodes(t)
    assert len(nodes) == 8 + 4 + 2 + 2 * 6
    for n in nodes:
        st = os.lstat(n["host_path"])
        assert stat.S_ISCHR(st.st_mode), n
        assert (os.major(st.st_rdev), os.minor(st.st_rdev)) == (n["major"], n["minor"]), n
        assert stat.S_IMODE(st.st_mode) == n["mode"], n
        assert n["host_path"] == t["dev_root"] + n["path"]
    assert t["mig_caps"]["config"]["mode"] == 0o400
    assert {n["mode"] for n in t["gpus"][1]["mig_devices"][0]["caps_nodes"]} == {0o444}


def soname_of(path: str) -> str:
    out = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True)
    found = re.search(r"\(SONAME\)\s+Library soname: \[(.+)\]", out.stdout)
    assert found, out.stdout
    return found.group(1)


def test_libraries_are_elf_with_real_sonames(built: Built) -> None:
    from gpuhook.inventory import catalog

    t = built.truth
    libs = {lib["name"]: lib for group in t["libraries"].values() for lib in group}
    for capability in ("utility", "compute", "video", "graphics", "ngx"):
        for name in catalog.LIBRARIES[capability]:
            assert (name in libs) != (name in t["absent_libraries"]), name
        assert [lib["name"] for lib in t["libraries"][capability]] == [
            n for n in catalog.LIBRARIES[capability] if n not in t["absent_libraries"]
        ]
    expected = {
        "libcuda.so": "libcuda.so.1",
        "libnvidia-ml.so": "libnvidia-ml.so.1",
        "libnvidia-nvvm.so": "libnvidia-nvvm.so.4",
        "libGLX_nvidia.so": "libGLX_nvidia.so.0",
        "libGLESv2_nvidia.so": "libGLESv2_nvidia.so.2",
        "libnvidia-glcore.so": "libnvidia-glcore.so.550.54.15",
    }
    for name, soname in expected.items():
        assert libs[name]["soname"] == soname
    for lib in libs.values():
        host = lib["host_path"]
        assert host == t["driver_root"] + lib["path"] == f"{t['driver_root']}{LIBDIR}/{lib['file']}"
        assert Path(host).read_bytes()[:4] == b"\x7fELF"
        assert soname_of(host) == lib["soname"]
        if lib["soname_link"] is None:
            assert lib["soname"] == lib["file"]
        else:
            assert os.readlink(t["driver_root"] + lib["soname_link"]) == lib["file"]
    listing = os.listdir(t["driver_root"] + LIBDIR)
    for name in t["absent_libraries"]:
        assert not any(f.startswith(name) for f in listing), name
    smi = t["driver_root"] + "/usr/bin/nvidia-smi"
    dyn = subprocess.run(["readelf", "-d", smi], capture_output=True, text=True, check=True).stdout
    assert "Shared library: [libnvidia-ml.so.1]" in dyn
    assert "RPATH" not in dyn and "RUNPATH" not in dyn


def test_ld_so_cache_lists_the_sonames(built: Built) -> None:
    t = built.truth
    cache = t["driver_root"] + "/etc/ld.so.cache"
    assert t["ld_so_cache"] == cache
    assert Path(t["driver_root"], "etc/ld.so.conf").read_text() == LIBDIR + "\n"
    out = subprocess.run(
        ["/sbin/ldconfig", "-p", "-C", cache], capture_output=True, text=True, check=True
    ).stdout
    for group in t["libraries"].values():
        for lib in group:
            assert f"\t{lib['soname']} (libc6,x86-64) => {LIBDIR}/{lib['soname']}\n" in out, lib


def test_driver_files(built: Built) -> None:
    t = built.truth
    d = t["driver_root"]
    ver = t["driver_version"]
    assert f"Kernel Module  {ver}  " in Path(d, "proc/driver/nvidia/version").read_text()
    assert Path(d, "sys/module/nvidia/version").read_text() == ver + "\n"
    devices = Path(d, "proc/devices").read_text()
    assert devices.startswith("Character devices:\n")
    assert "195 nvidia-frontend\n" in devices
    assert f"{t['uvm_major']} nvidia-uvm\n" in devices
    assert f"{t['caps_major']} nvidia-caps\n" in devices
    assert Path(d, "proc/driver/nvidia/capabilities/mig/config").read_text() == (
        "DeviceFileMinor: 1\nDeviceFileMode: 256\nDeviceFileModify: 1\n"
    )
    assert Path(d, "proc/driver/nvidia/capabilities/mig/monitor").read_text() == (
        "DeviceFileMinor: 2\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
    )
    minors_table = Path(d, "proc/driver/nvidia-caps/mig-minors").read_text().splitlines()
    assert minors_table[:4] == [
        "config 1",
        "monitor 2",
        "gpu0/gi0/access 3",
        "gpu0/gi0/ci0/access 4",
    ]
    assert minors_table[-1] == "gpu31/gi14/ci7/access 4322"
    for g in t["gpus"]:
        for m in g["mig_devices"]:
            for minor, proc in zip(m["caps_minors"], m["caps_proc_paths"], strict=True):
                assert Path(d + proc).read_text() == (
                    f"DeviceFileMinor: {minor}\nDeviceFileMode: 292\nDeviceFileModify: 1\n"
                )
                assert f"{proc.split('capabilities/')[1].replace('/mig/', '/')} {minor}" in (
                    minors_table
                )
    for sock in t["sockets"]:
        assert stat.S_ISSOCK(os.lstat(sock["host_path"]).st_mode)
    for fw in t["firmware"]:
        assert os.path.getsize(fw["host_path"]) > 0
        assert fw["path"].startswith(f"/lib/firmware/nvidia/{ver}/")
    assert {b["name"] for b in t["binaries"]} == {
        "nvidia-smi",
        "nvidia-debugdump",
        "nvidia-persistenced",
        "nvidia-cuda-mps-control",
        "nvidia-cuda-mps-server",
    }
    for b in t["binaries"]:
        assert os.access(b["host_path"], os.X_OK)
        if b["name"] not in ("nvidia-smi", "nvidia-cuda-mps-control"):  # own fakes, own tests
            out = subprocess.run([b["host_path"]], capture_output=True, text=True, check=True)
            assert b["name"] in out.stdout
    import yaml

    config = yaml.safe_load(Path(t["config"]).read_text())
    assert config == {
        "driver_root": d,
        "dev_root": t["dev_root"],
        "state_dir": t["state_dir"],
        "runtime": {
            "path": t["runtime"],
            "service": os.path.join(os.path.dirname(t["config"]), "runtime.sock"),
        },
        "log": {"level": "debug", "file": t["log_file"]},
        "hook": {"path": str(REPO / ".venv/bin/gpuhook"), "ldconfig": "/sbin/ldconfig"},
        "cdi": {
            "output": os.path.join(os.path.dirname(t["config"]), "cdi", "gpuhook-nvidia.json"),
            "spec_dirs": [os.path.join(os.path.dirname(t["config"]), "cdi")],
        },
    }
    assert os.path.isabs(t["runtime"])
    assert Path(t["state_dir"]).is_dir() and not os.listdir(t["state_dir"])


def expected_view(truth: dict[str, Any], hidden: Collection[int] = ()) -> list[dict[str, Any]]:
    """What NVML must report: visible GPUs renumbered 0..n-1, minors kept."""
    view: list[dict[str, Any]] = []
    for g in (g for g in truth["gpus"] if g["minor"] not in hidden):
        view.append(
            {
                "index": len(view),
                "uuid": g["uuid"],
                "minor": g["minor"],
                "name": g["name"],
                "memory": g["memory"],
                "memory_v2": g["memory"],
                "pci_bus_id": g["pci_bus_id"],
                "cc": g["compute_capability"],
                "mig": [int(g["mig_enabled"])] * 2,
                "max_mig": 7 if g["mig_enabled"] else 0,
                "is_mig": 0,
                "by_uuid": len(view),
                "persistence": 1,
                "migs": [
                    {
                        "index": m["index"],
                        "uuid": m["uuid"],
                        "gi": m["gi_id"],
                        "ci": m["ci_id"],
                        "name": m["name"],
                        "memory": m["memory"],
                        "is_mig": 1,
                        "parent": g["uuid"],
                    }
                    for m in g["mig_devices"]
                ],
            }
        )
    return view


def test_pynvml_reports_the_truth(built: Built) -> None:
    got = probe(built)
    t = built.truth
    assert (got["driver"], got["cuda"], got["cuda_v2"], got["nvml"]) == (
        "550.54.15",
        12040,
        12040,
        "12.550.54.15",
    )
    assert got["gpus"] == expected_view(t)
    assert got["gi_on_gpu"] == "Invalid Argument"
    assert got["after_shutdown"] == "Uninitialized"


def test_missing_device_node_hides_the_gpu(built: Built, removed: list[Path]) -> None:
    node = Path(built.truth["dev_root"], "dev/nvidia3")
    node.unlink()
    removed.append(node)
    got = probe(built)
    assert len(got["gpus"]) == 7
    assert got["gpus"] == expected_view(built.truth, hidden={3})


def test_mig_device_needs_its_caps_nodes(built: Built, removed: list[Path]) -> None:
    t = built.truth
    target = t["gpus"][2]["mig_devices"][1]
    for path in (t["mig_caps"]["monitor"]["host_path"], target["caps_nodes"][0]["host_path"]):
        Path(path).unlink()
        removed.append(Path(path))
    got = probe(built)
    assert [m["index"] for m in got["gpus"][2]["migs"]] == [0, 2]
    assert [m["index"] for m in got["gpus"][1]["migs"]] == [0, 1, 2]


def test_missing_data_file_falls_back_to_embedded_copy(built: Built) -> None:
    got = probe(built, FAKE_NVML_DATA=str(built.root / "no-such-file"))
    assert got["driver"] == "550.54.15"
    assert got["cuda"] == 12040
    # the embedded copy's dev_root is "/": this host has no /dev/nvidia<minor>
    expected_gpus = sum(os.path.exists(f"/dev/nvidia{g['minor']}") for g in built.truth["gpus"])
    assert len(got["gpus"]) == expected_gpus


def test_compute_mode_is_shared_between_processes(built: Built) -> None:
    script = (
        "import sys, pynvml as n; n.nvmlInit(); h = n.nvmlDeviceGetHandleByIndex(7);\n"
        "if len(sys.argv) > 1: n.nvmlDeviceSetComputeMode(h, int(sys.argv[1]))\n"
        "print(n.nvmlDeviceGetComputeMode(h))"
    )

    def run(*args: str) -> str:
        out = subprocess.run(
            [PYTHON, "-c", script, *args],
            capture_output=True,
            text=True,
            check=True,
            env=nvml_env(built),
        )
        return out.stdout.strip()

    assert run() == "0"
    try:
        assert run("3") == "3"
        assert run() == "3"
    finally:
        run("0")


def test_nvidia_smi_lists_the_gpus(built: Built) -> None:
    t = built.truth
    smi = t["driver_root"] + "/usr/bin/nvidia-smi"
    expected = []
    for g in t["gpus"]:
        expected.append(f"GPU {g['index']}: {g['name']} (UUID: {g['uuid']})")
        expected += [
            f"  MIG {m['profile']} Device {j}: (UUID: {m['uuid']})"
            for j, m in enumerate(g["mig_devices"])
        ]
    out = subprocess.run(
        [smi, "-L"], capture_output=True, text=True, env=nvml_env(built), check=False
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.splitlines() == expected
    out = subprocess.run([smi], capture_output=True, text=True, env=nvml_env(built), check=False)
    assert out.returncode == 0
    assert "NVIDIA-SMI 550.54.15  Driver Version: 550.54.15  CUDA Version: 12.4" in out.stdout
    assert out.stdout.splitlines()[3:] == expected
    out = subprocess.run(
        [smi, "--query-gpu=index,uuid", "--format=csv,noheader"],
        capture_output=True,
        text=True,
        env=nvml_env(built),
        check=True,
    )
    assert out.stdout.splitlines() == [f"{g['index']}, {g['uuid']}" for g in t["gpus"]]


def test_nvidia_smi_without_nvml_fails(built: Built) -> None:
    if host_has_nvml():
        pytest.skip("this host has a real libnvidia-ml.so.1")
    smi = built.truth["driver_root"] + "/usr/bin/nvidia-smi"
    env = {k: v for k, v in os.environ.items() if k != "LD_LIBRARY_PATH"}
    out = subprocess.run([smi], capture_output=True, text=True, env=env, check=False)
    assert out.returncode != 0
    assert "GPU 0:" not in out.stdout
    assert out.returncode == 9 or "libnvidia-ml.so.1" in out.stderr


def test_options_no_nvml_no_ldcache_and_force(tmp_path: Path) -> None:
    root = tmp_path / "n"
    b = build(root, "--gpus", "1", "--no-nvml", "--no-ldcache", "--driver-version", "535.104.05")
    t = b.truth
    assert "libnvidia-ml.so" in t["absent_libraries"]
    assert "libnvidia-ml.so" not in {lib["name"] for lib in t["libraries"]["utility"]}
    assert not any(f.startswith("libnvidia-ml") for f in os.listdir(t["driver_root"] + LIBDIR))
    assert t["ld_so_cache"] is None
    assert not Path(t["driver_root"], "etc/ld.so.cache").exists()
    assert soname_of(t["driver_root"] + f"{LIBDIR}/libnvidia-glcore.so.535.104.05") == (
        "libnvidia-glcore.so.535.104.05"
    )
    if not host_has_nvml():
        out = subprocess.run(
            [PYTHON, "-c", "import pynvml; pynvml.nvmlInit()"],
            env=nvml_env(b),
            capture_output=True,
            text=True,
            check=False,
        )
        assert "NVMLError_LibraryNotFound" in out.stderr

    again = run_tool(root, "--gpus", "1")
    assert again.returncode == 1
    assert len(again.stderr.strip().splitlines()) == 1 and "--force" in again.stderr
    b = build(root, "--gpus", "1", "--mig-gpus", "0", "--mig-devices", "7", "--force")
    migs = b.truth["gpus"][0]["mig_devices"]
    assert [m["gi_id"] for m in migs] == list(range(7, 14))
    assert {m["profile"] for m in migs} == {"1g.10gb"}
    got = probe(b)
    assert [m["gi"] for m in got["gpus"][0]["migs"]] == list(range(7, 14))
    assert got["gpus"] == expected_view(b.truth)


def test_refuses_bad_input(tmp_path: Path) -> None:
    stranger = tmp_path / "stranger"
    stranger.mkdir()
    (stranger / "keep.txt").write_text("mine")
    out = run_tool(stranger, "--force")
    assert out.returncode == 1
    assert (stranger / "keep.txt").read_text() == "mine"
    for args in (
        ("--gpus", "2", "--mig-gpus", "5"),
        ("--mig-devices", "8"),
        ("--driver-version", "x"),
        ("--gpus", "-1"),
    ):
        out = run_tool(tmp_path / "bad", *args)
        assert out.returncode == 1, args
        assert out.stderr.startswith("fake-node: ") and out.stderr.count("\n") == 1, out.stderr
        assert out.stdout == ""
    setpriv = shutil.which("setpriv")
    if setpriv:
        out = subprocess.run(
            [
                setpriv,
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
                "/usr/bin/python3",
                str(TOOL),
                str(tmp_path / "nobody"),
            ],
            capture_output=True,
            text=True,
            check=False,
        )
        assert out.returncode == 1
        assert out.stderr == "fake-node: must run as root (device nodes are made with mknod)\n"


def test_the_driver_root_has_what_a_real_driver_installs(built: Built, tmp_path: Path) -> None:
    """Development links (libcuda.so -> libcuda.so.1), the graphics loader files naming the
    libraries by soname, the GPU brand through NVML; and the same in the GKE layout."""
    for b in (built, build(tmp_path / "gke", "--gpus", "1", "--layout", "gke")):
        t = b.truth
        d = t["driver_root"]
        links = [lib for libs in t["libraries"].values() for lib in libs if lib["dev_link"]]
        assert {lib["name"] for lib in links} >= {"libcuda.so", "libnvidia-ml.so"}
        for lib in links:
            assert lib["dev_link"] == f"{t['libdir']}/{lib['name']}"
            assert os.readlink(d + lib["dev_link"]) == lib["soname"]
            assert os.path.samefile(d + lib["dev_link"], lib["host_path"])
        names = {lib["soname"] for libs in t["libraries"].values() for lib in libs}
        for loader in t["loader_files"]:
            doc = json.loads(Path(loader["host_path"]).read_text())
            section = doc.get("ICD") or doc["layer"]
            assert section["library_path"] == loader["library_path"] in names
        got = subprocess.run(
            [PYTHON, "-c", "import pynvml as n; n.nvmlInit(); "
             "print(n.nvmlDeviceGetBrand(n.nvmlDeviceGetHandleByIndex(0)))"],
            env=nvml_env(b), capture_output=True, text=True, check=True,
        )  # fmt: skip
        assert int(got.stdout) == t["gpus"][0]["brand"] == 14
    gke = b.truth
    assert gke["layout"] == "gke" and gke["libdir"] == "/lib64" and gke["ld_so_cache"] is None
    assert [f["path"] for f in gke["loader_files"]] == [
        "/share/glvnd/egl_vendor.d/10_nvidia.json",
        "/share/vulkan/icd.d/nvidia_icd.json",
        "/share/vulkan/implicit_layer.d/nvidia_layers.json",
    ]
    assert os.access(gke["driver_root"] + "/bin/nvidia-smi", os.X_OK)
    assert not Path(gke["driver_root"], "etc").exists()
