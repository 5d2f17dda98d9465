"""`gpuhook selftest` on a fake GPU node with real runc: it passes on a healthy node, says in
one line why when the runtime is broken (runtime.path wrong, the hook not executable, a GPU's
device node missing, the MPS daemon down), runs the CUDA program it is given in each GPU
container, goes through the runtime service when one listens, and leaves nothing behind: no
container, cgroup, mount, bundle, record link or exec-env marker outside its temp folder."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import testbed

from tests.conftest import FakeNode, mps_daemons_under
from tests.integration.test_mps import Mps

pytestmark = [pytest.mark.slow, pytest.mark.root]

RUNC = shutil.which("runc") or "/usr/sbin/runc"

# A stand-in for the CUDA program (C, linked against the host's libc: the rootfs must carry it):
# it reports the device it was granted (NVIDIA_VISIBLE_DEVICES holds its UUID), 132 SMs scaled
# by the MPS thread limit, and an allocation, in the output format of gpuhook's CUDA program.
FAKE_CUDA = r"""
#include <stdio.h>
#include <stdlib.h>
int main(void) {
    const char *dev = getenv("NVIDIA_VISIBLE_DEVICES");
    const char *pct = getenv("CUDA_MPS_ACTIVE_THREAD_PERCENTAGE");
    if (getenv("FAIL_CUDA") || !dev) {
        printf("error: cudaGetDeviceCount: no CUDA-capable device is detected\n");
        return 1;
    }
    printf("devices: 1\ndevice: Fake H100\nuuid: %s\n", dev);
    printf("sms: %d\nalloc: %d\nok\n", pct ? 132 * atoi(pct) / 100 : 132, 256 << 20);
    return 0;
}
"""


@pytest.fixture(scope="module")
def snode(fake_node_factory: Any) -> FakeNode:
    """2 GPUs: GPU 0 whole, GPU 1 in MIG mode with 2 MIG devices."""
    n: FakeNode = fake_node_factory("--gpus", "2", "--mig-gpus", "1", "--mig-devices", "2")
    n.refresh()
    return n


@pytest.fixture(scope="module")
def fake_cuda(tmp_path_factory: pytest.TempPathFactory) -> Path:
    folder = tmp_path_factory.mktemp("cuda")
    (folder / "fake.c").write_text(FAKE_CUDA)
    out = folder / "fake-cuda"
    subprocess.run(["gcc", "-O1", "-o", str(out), str(folder / "fake.c")], check=True)
    return out


def selftest(
    node: FakeNode, *args: str, env: dict[str, str] | None = None, gpuhook: str = testbed.GPUHOOK
) -> tuple[int, dict[str, Any], str]:
    """Run `gpuhook selftest -o json ARGS`: (exit code, the view, stderr)."""
    out = subprocess.run(
        [gpuhook, "selftest", "-o", "json", *args],
        capture_output=True,
        text=True,
        env={**os.environ, **node.env, **(env or {})},
        check=False,
        timeout=300,
    )
    assert out.stdout, out.stderr
    return out.returncode, json.loads(out.stdout), out.stderr


def lines(view: dict[str, Any]) -> dict[str, tuple[str, str, str]]:
    return {c["check"]: (c["status"], c["message"], c["fix"]) for c in view["checks"]}


def failed(view: dict[str, Any]) -> list[tuple[str, str, str]]:
    return [(c["check"], c["message"], c["fix"]) for c in view["checks"] if c["status"] == "fail"]


def uuid(node: FakeNode, gpu: int, mig: int | None = None) -> str:
    entry = node.truth["gpus"][gpu]
    return str(entry["uuid"] if mig is None else entry["mig_devices"][mig]["uuid"])


def leftovers(node: FakeNode, state_dir: Path) -> dict[str, Any]:
    """What a run could leave outside its temp folder: the state folder (records, exec-env
    markers, temp folders), runc's default state root, cgroups and mounts named after it."""
    cgroups = sorted(
        str(p) for p in Path("/sys/fs/cgroup").glob("*/*") if "gpuhook-selftest" in p.name
    ) + sorted(str(p) for p in Path("/sys/fs/cgroup").glob("*") if "gpuhook-selftest" in p.name)
    runc = subprocess.run([RUNC, "list", "-q"], capture_output=True, text=True, check=False)
    mounts = Path("/proc/self/mountinfo").read_text().splitlines()
    return {
        # containers.swept: when a create last swept the records (the sweep's stamp, kept)
        "state": sorted(
            str(p.relative_to(state_dir)) for p in state_dir.rglob("*")
            if p.name != "containers.swept"
        ),
        "runc": sorted(runc.stdout.split()),
        "cgroups": cgroups,
        "mounts": [m for m in mounts if "gpuhook-selftest" in m or str(state_dir) in m],
    }


def test_a_healthy_node_passes_and_leaves_nothing_behind(snode: FakeNode) -> None:
    state = snode.root / "state"
    before = leftovers(snode, state)
    code, view, stderr = selftest(snode)
    assert (code, stderr) == (0, ""), view
    got = lines(view)
    assert [c["check"] for c in view["checks"]] == [
        *("runtime", "inventory", "bundle", "plain", "gpu 0", "mig 1:0", "mig 1:1"),
        *("kubernetes", "mps", "cleanup"),
    ]
    assert {k: v[0] for k, v in got.items()} == {
        **{k: "pass" for k in got},
        "mps": "skip",
    }
    assert got["gpu 0"][1] == (
        f"GPU 0 {uuid(snode, 0)}: the container saw /dev/nvidia0 only and nvidia-smi -L listed "
        "it alone; its decision record grants it (cdi-annotation)"
    )
    caps = snode.truth["gpus"][1]["mig_devices"][1]["caps_nodes"]
    assert got["mig 1:1"][1].startswith(
        f"MIG 1:1 {uuid(snode, 1, 1)} (NVIDIA H100 80GB HBM3 MIG 2g.20gb): the container saw "
        f"/dev/nvidia1, {', '.join(sorted(c['path'] for c in caps))} only and nvidia-smi -L"
    )
    assert got["kubernetes"][1].startswith(
        "an unallocated pod container (containerd's identity annotations) whose image sets "
        "NVIDIA_VISIBLE_DEVICES=all saw no GPU (NVIDIA_VISIBLE_DEVICES=void): "
    )
    assert got["plain"][1].endswith("straight to the runtime (no record, no GPU)")
    work = view["work_dir"]
    assert work.startswith(f"{state}/gpuhook-selftest-") and not os.path.exists(work)
    assert got["cleanup"][1] == (
        f"deleted its 10 containers, removed their 4 record links and {work}"
    )
    # every container timed through gpuhook-runtime and plain runc on the same bundle
    containers = view["containers"]
    timed = [(t["check"], t["gpuhook_runtime_ms"] > 0, t["runc_ms"] > 0) for t in containers]
    checked = ("plain", "gpu 0", "mig 1:0", "mig 1:1", "kubernetes")
    assert timed == [(c, True, True) for c in checked]
    assert view["runtimes"] == {"gpuhook-runtime": testbed.RUNTIME, "runc": RUNC}
    assert leftovers(snode, state) == before


def test_sigterm_still_cleans_up(snode: FakeNode) -> None:
    """Stopped part way (here: once its first container is under way), it deletes what it made
    and exits 143 with one line."""
    import signal
    import time

    state = snode.root / "state"
    before = leftovers(snode, state)
    proc = subprocess.Popen(
        [testbed.GPUHOOK, "selftest", "-o", "json"],
        env={**os.environ, **snode.env},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 60
    while not list(state.glob("gpuhook-selftest-*/containers/*")) and time.monotonic() < deadline:
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=120)
    assert (proc.returncode, out, err) == (143, "", "gpuhook: selftest: interrupted by SIGTERM\n")
    assert leftovers(snode, state) == before


def test_the_table(snode: FakeNode) -> None:
    out = snode.gpuhook("selftest", "-o", "table", "--gpu", "0")
    assert out.returncode == 0, out.stdout + out.stderr
    text = out.stdout.splitlines()
    assert text[0].startswith(f"PASS  runtime     {testbed.RUNTIME} (low-level runtime: {RUNC}); ")
    assert any(line.startswith("CONTAINER   GPUHOOK-RUNTIME  RUNC ") for line in text)
    assert text[-1] == "selftest: 0 failed, 7 passed, 1 skipped"
    yaml_out = snode.gpuhook("selftest", "-o", "yaml", "--gpu", "1:0")
    import yaml

    view = yaml.safe_load(yaml_out.stdout)
    assert view["ok"] is True and [c["check"] for c in view["checks"]][4] == "mig 1:0"


def test_runtime_path_wrong_fails_with_the_one_line(snode: FakeNode, tmp_path: Path) -> None:
    env = snode.variant(tmp_path, runtime={"path": "/nonexistent/runc"})
    code, view, stderr = selftest(snode, env=env)
    config = env["GPUHOOK_CONFIG"]
    assert (code, stderr) == (1, "gpuhook: selftest: 1 failed: plain\n")
    assert failed(view) == [
        (
            "plain",
            "create failed: gpuhook: low-level OCI runtime /nonexistent/runc not found (searched "
            "PATH and /usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin); install "
            f"runc or set runtime.path in {config}",
            f"install runc, or set runtime.path in {config} to it",
        )
    ]
    assert lines(view)["gpus"][0] == "skip"
    assert lines(view)["cleanup"][0] == "pass"


def test_hook_not_executable_fails_with_the_one_line(snode: FakeNode, tmp_path: Path) -> None:
    hook = tmp_path / "gpuhook"
    shutil.copy2(testbed.GPUHOOK, hook)
    hook.chmod(0o644)
    env = snode.variant(tmp_path, hook={"path": str(hook)})
    code, view, _ = selftest(snode, env=env)
    assert code == 1
    (only,) = failed(view)
    assert only[0] == "gpu 0"
    assert only[1].startswith("create failed: ")
    assert f"error running hook #0: fork/exec {hook}: permission denied" in only[1]
    assert only[2] == (
        f"make {hook} executable (and /sbin/ldconfig), or set hook.path in "
        f"{env['GPUHOOK_CONFIG']}"
    )
    got = lines(view)
    assert got["mig 1:0"][:2] == got["mig 1:1"][:2] == ("skip", "not judged: failed as gpu 0 did")
    assert got["plain"][0] == got["kubernetes"][0] == got["cleanup"][0] == "pass"
    assert got["cleanup"][1].startswith("deleted its 4 containers, removed their 4 record links")


def test_a_missing_device_node_fails_with_the_one_line(snode: FakeNode) -> None:
    node = Path(snode.truth["gpus"][0]["device_node"]["host_path"])
    moved = node.with_name("nvidia0.moved")
    node.rename(moved)
    try:
        code, view, _ = selftest(snode)
    finally:
        moved.rename(node)
    assert code == 1
    assert failed(view) == [
        (
            "gpu 0",
            f"{node} (GPU 0) is missing on the host: NVML and engines that pass device nodes "
            "(CDI, --device) cannot reach it",
            "load the NVIDIA kernel modules and create the device nodes (nvidia-modprobe -c "
            "<minor> -u, or run nvidia-smi once), then: gpuhook inventory refresh",
        )
    ]
    assert lines(view)["mig 1:0"][0] == "pass"


@pytest.fixture
def smps(snode: FakeNode, tmp_path: Path) -> Iterator[Mps]:
    m = Mps(snode, tmp_path / "mps-test")
    yield m
    m.cleanup()


def test_mps_client_gets_its_limits_and_a_daemon_down_fails(
    snode: FakeNode, smps: Mps, fake_cuda: Path
) -> None:
    env = smps.configure(gpus=[0], replicas=4)
    smps.start()
    code, view, _ = selftest(snode, "--cuda", "--cuda-program", str(fake_cuda), env=env)
    assert code == 0, failed(view)
    got = lines(view)
    share = snode.truth["gpus"][0]["memory"] // 4 >> 20
    assert got["mps gpu0"] == (
        "pass",
        "GPU 0: the client got CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=25, "
        f"CUDA_MPS_PINNED_DEVICE_MEM_LIMIT=0={share}M, pipe /run/gpuhook/mps/pipe; the control "
        "daemon answered get_default_active_thread_percentage: 25.0",
        "",
    )
    assert got["cuda mps gpu0"][:2] == (
        "pass",
        f"Fake H100 ({uuid(snode, 0)}), 33 SMs (MPS active thread percentage 25), allocated "
        "256 MiB and ran a kernel on it",
    )
    assert "Cmd:get_default_active_thread_percentage" in smps.log("gpu0")

    smps.gpuhook("mps", "stop")
    assert mps_daemons_under(smps.root) == []
    code, view, stderr = selftest(snode, "--gpu", "0", env=env)
    assert (code, stderr) == (1, "gpuhook: selftest: 1 failed: gpu 0\n")
    assert failed(view) == [
        (
            "gpu 0",
            "create failed: gpuhook: the MPS control daemon of GPU 0 (group gpu0) is not "
            "running; start it: gpuhook mps start gpu0",
            "gpuhook mps start gpu0 (or: systemctl start gpuhook-mps@gpu0)",
        )
    ]
    assert lines(view)["mps gpu0"][:2] == ("skip", "not judged: failed as gpu 0 did")


def test_the_cuda_program_runs_in_each_gpu_container(snode: FakeNode, fake_cuda: Path) -> None:
    code, view, _ = selftest(snode, "--cuda", "--cuda-program", str(fake_cuda))
    assert code == 0, failed(view)
    got = lines(view)
    assert got["cuda"] == ("pass", f"the CUDA program: --cuda-program {fake_cuda}", "")
    assert got["cuda gpu 0"][:2] == (
        "pass",
        f"Fake H100 ({uuid(snode, 0)}), 132 SMs, allocated 256 MiB and ran a kernel on it",
    )
    assert got["cuda mig 1:1"][1].startswith(f"Fake H100 ({uuid(snode, 1, 1)}), 132 SMs")
    # a program that fails: its own error line
    code, view, _ = selftest(
        snode, "--gpu", "0", "--cuda", "--cuda-program", str(fake_cuda), env={"FAIL_CUDA": "1"}
    )
    assert code == 0, "the container's env is the spec's, never the caller's"
    broken = fake_cuda.with_name("broken-cuda")
    broken.write_text("#!/bin/sh\necho 'error: cudaGetDeviceCount: no CUDA device'\nexit 3\n")
    broken.chmod(0o755)
    code, view, _ = selftest(snode, "--gpu", "0", "--cuda", "--cuda-program", str(broken))
    assert code == 1
    assert failed(view) == [
        (
            "cuda gpu 0",
            "exited with 3: cudaGetDeviceCount: no CUDA device",
            "run the program on the host to tell the driver from the container: if it fails "
            "there too, fix the driver or CUDA install; else gpuhook doctor",
        )
    ]


FAKE_NVCC = """#!/bin/sh
# a stand-in for nvcc: records its argv, "builds" the fake CUDA program (or fails as told)
printf '%s\\n' "$@" > {argv}
if [ -n "{fail}" ]; then echo "nvcc fatal   : {fail}" >&2; exit 1; fi
while [ "$1" != "-o" ]; do shift; done
exec cp {program} "$2"
"""


@pytest.mark.parametrize("fail", ["", "Unsupported gpu architecture 'compute_90'"])
def test_cuda_builds_gpuhooks_program_with_the_hosts_nvcc(
    snode: FakeNode, fake_cuda: Path, tmp_path: Path, fail: str
) -> None:
    """Without --cuda-program, gpuhook's cuda_probe.cu is built with the nvcc on PATH, for the
    GPUs' compute capability, statically linked to the CUDA runtime; a failed build is the
    cuda line, and the GPU checks go on without the program."""
    from gpuhook.selftest import cuda

    bindir = tmp_path / "bin"
    bindir.mkdir()
    nvcc = bindir / "nvcc"
    argv = tmp_path / "argv"
    nvcc.write_text(FAKE_NVCC.format(argv=argv, fail=fail, program=fake_cuda))
    nvcc.chmod(0o755)
    path = f"{bindir}:{os.environ['PATH']}"
    code, view, _ = selftest(snode, "--gpu", "0", "--cuda", env={"PATH": path})
    got = lines(view)
    built = argv.read_text().splitlines()
    assert built[:4] == ["-O2", "-cudart", "static", "-o"]
    assert built[4].startswith(view["work_dir"]) and built[5] == cuda.SOURCE
    gencode = ["arch=compute_90,code=sm_90", "arch=compute_90,code=compute_90"]
    assert built[6:] == [w for g in gencode for w in ("-gencode", g)]
    if fail:
        assert code == 1
        assert failed(view) == [
            (
                "cuda",
                f"built with {nvcc} for sm_90: failed: nvcc fatal : {fail}",
                "give a program built elsewhere: --cuda-program PATH (nvcc -cudart static -o "
                f"PATH {cuda.SOURCE})",
            )
        ]
        assert got["gpu 0"][0] == "pass" and "cuda gpu 0" not in got
    else:
        assert code == 0, failed(view)
        assert got["cuda"][1] == f"the CUDA program: built with {nvcc} for sm_90"
        assert got["cuda gpu 0"][1].startswith(f"Fake H100 ({uuid(snode, 0)}), 132 SMs")


def test_through_the_runtime_service(
    snode: FakeNode, tmp_path: Path, socket_folder: Path, runtime_service: Any
) -> None:
    socket = socket_folder / "rt.sock"
    env = snode.variant(tmp_path, runtime={"service": str(socket)})
    runtime_service(env, socket, from_config=True)
    code, view, _ = selftest(snode, env=env)
    assert code == 0, failed(view)
    assert f"; the runtime service at {socket} decides GPU creates; " in lines(view)["runtime"][1]


def test_gpu_picks_devices_and_an_unknown_one_is_a_usage_error(snode: FakeNode) -> None:
    code, view, _ = selftest(snode, "--gpu", "1:1", "--gpu", uuid(snode, 0))
    assert code == 0
    assert [c["check"] for c in view["checks"]][3:6] == ["plain", "mig 1:1", "gpu 0"]
    state = snode.root / "state"
    before = sorted(os.listdir(state))
    out = snode.gpuhook("selftest", "--gpu", "7")
    assert (out.returncode, out.stdout) == (2, "")
    assert out.stderr == (
        "gpuhook: selftest --gpu 7: this node has no such device (gpu 0, mig 1:0, mig 1:1)\n"
    )
    assert sorted(os.listdir(state)) == before
    out = snode.gpuhook("selftest", "--cuda-program", "/bin/true")
    assert (out.returncode, out.stderr) == (2, "gpuhook: selftest: --cuda-program needs --cuda\n")


def test_tests_the_gpuhook_runtime_installed_beside_it(snode: FakeNode, tmp_path: Path) -> None:
    """As on a DaemonSet's node: /opt/gpuhook/bin/gpuhook tests /opt/gpuhook/bin/gpuhook-runtime."""
    bindir = tmp_path / "opt" / "gpuhook" / "bin"
    bindir.mkdir(parents=True)
    for name in ("gpuhook", "gpuhook-runtime"):
        shutil.copy2(Path(testbed.BUILD_BIN) / name, bindir / name)
    code, view, _ = selftest(snode, "--gpu", "0", gpuhook=str(bindir / "gpuhook"))
    assert code == 0, failed(view)
    assert view["runtimes"]["gpuhook-runtime"] == str(bindir / "gpuhook-runtime")
    missing = bindir / "gpuhook-runtime"
    missing.unlink()
    code, view, _ = selftest(snode, "--gpu", "0", gpuhook=str(bindir / "gpuhook"))
    assert failed(view) == [
        (
            "runtime",
            f"{missing} is not an executable file",
            "install gpuhook, or name the gpuhook-runtime to test: --runtime PATH",
        )
    ]
    assert [c["check"] for c in view["checks"]] == ["runtime", "inventory", "cleanup"]


def test_without_busybox_the_hosts_sh_and_its_libraries_make_the_rootfs(
    snode: FakeNode, tmp_path: Path
) -> None:
    """A node without busybox (a Kubernetes node, seen through chroot /host): the rootfs gets
    the host's /bin/sh, its loader and libraries, and those nvidia-smi needs beside the driver's
    own (which gpuhook-runtime injects); a GPU container runs the probe there."""
    from gpuhook.config import loading as config_loading
    from gpuhook.inventory import store
    from gpuhook.selftest import bundle, lifecycle, rootfs

    config = config_loading.load(snode.env["GPUHOOK_CONFIG"], use_cache=False)
    inventory = store.load_current(config)
    smi = next(f for f in inventory.files if f.name == "nvidia-smi")
    built = rootfs.build(str(tmp_path / "t"), inventory, "", [smi.path], "/sbin/ldconfig", {})
    sh = os.path.realpath("/bin/sh")
    assert built.shell == f"/bin/sh ({sh})"
    assert (tmp_path / "t/bin/sh").read_bytes() == Path(sh).read_bytes()
    assert "/lib64/ld-linux-x86-64.so.2" in built.libraries
    assert any(p.endswith("/libc.so.6") for p in built.libraries)
    assert not any("nvidia" in p for p in built.libraries)  # the driver's: injected, not copied
    assert (tmp_path / "t/etc/ld.so.cache").is_file()

    path = tmp_path / "b"
    rootfs.clone(built.path, str(path / "rootfs"))
    annotations = {"cdi.k8s.io/test": f"nvidia.com/gpu={uuid(snode, 0)}"}
    script = bundle.probe(smi.container_path)
    bundle.write_spec(str(path), bundle.spec(("/bin/sh", "-c", script), [], annotations))
    runtime = lifecycle.Runtime(testbed.RUNTIME, str(tmp_path / "root"), snode.env)
    ran = runtime.run(str(path), "no-busybox", 60)  # no subreaper here: no exit code
    try:
        assert (ran.error, ran.code) == ("", None), ran
    finally:
        assert runtime.delete("no-busybox") == ""
        # gpuhook-runtime's delete takes the record link with it
        assert not (Path(config.records_dir) / "no-busybox.json").is_symlink()
    seen = bundle.parse(ran.stdout)
    assert seen.done and seen.gpu_nodes() == ["/dev/nvidia0"]
    assert seen.sections[bundle.SMI].code == 0
    assert seen.sections[bundle.SMI].lines == (
        f"GPU 0: NVIDIA H100 80GB HBM3 (UUID: {uuid(snode, 0)})",
    )
