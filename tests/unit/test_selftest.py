"""`gpuhook selftest`'s pure parts: the probe and its parser, which devices --gpu picks, how a
CUDA program's output and a runtime's failure are read, and the table."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from gpuhook.config import locate
from gpuhook.errors import UsageError
from gpuhook.markers import may_request_gpu
from gpuhook.selftest import bundle, checks, cuda, lifecycle, report, session
from tests import factories as f


def test_the_plain_probe_carries_no_gpu_marker_and_the_gpu_probe_does() -> None:
    """The plain container must reach runc without Python: its spec holds no GPU marker. The
    GPU probe prints gpuhook's variables, whose names are markers."""
    plain = bundle.spec(("/bin/sh", "-c", bundle.probe(env=False)), [], {})
    assert not may_request_gpu(json.dumps(plain).encode())
    gpu = bundle.spec(("/bin/sh", "-c", bundle.probe("/usr/bin/nvidia-smi")), [], {})
    assert may_request_gpu(json.dumps(gpu).encode())


def test_parse_reads_nodes_env_and_sections() -> None:
    out = (
        "@dev /dev/nvidiactl\n@dev /dev/nvidia-caps/nvidia-cap12\n@dev /dev/nvidia10\n"
        "@dev /dev/nvidia2\n@env NVIDIA_VISIBLE_DEVICES=GPU-1\n@env CUDA_MPS_PIPE_DIRECTORY=\n"
        "@begin smi\nGPU 0: X (UUID: GPU-1)\n@end smi\n@end smi 0\n"
        "@begin cuda\ndevice: X\n"
    )
    seen = bundle.parse(out)
    assert seen.gpu_nodes() == ["/dev/nvidia2", "/dev/nvidia10"]
    assert seen.cap_nodes() == ["/dev/nvidia-caps/nvidia-cap12"]
    assert seen.env == {"NVIDIA_VISIBLE_DEVICES": "GPU-1", "CUDA_MPS_PIPE_DIRECTORY": ""}
    assert seen.sections["smi"] == bundle.Section(("GPU 0: X (UUID: GPU-1)", "@end smi"), 0)
    assert seen.sections["cuda"] == bundle.Section(("device: X",), None)  # never ended
    assert not seen.done
    assert bundle.parse("@done\n").done


def test_targets_are_every_gpu_and_mig_device_or_those_named() -> None:
    inv = f.inventory(gpus=3, mig={1: 2})
    labels = [t.label for t in checks.targets(inv, ())]
    assert labels == ["gpu 0", "mig 1:0", "mig 1:1", "gpu 2"]
    picked = checks.targets(inv, ("1", f"{f.gpu_uuid(2)},1:0", f.mig_uuid(1, 1)))
    assert [t.label for t in picked] == ["mig 1:0", "mig 1:1", "gpu 2"]
    assert picked[2].uuid == f.gpu_uuid(2) and picked[0].uuid == f.mig_uuid(1, 0)
    with pytest.raises(UsageError) as err:
        checks.targets(inv, ("0", "9"))
    assert str(err.value) == (
        "selftest --gpu 9: this node has no such device (gpu 0, mig 1:0, mig 1:1, gpu 2)"
    )


def test_cuda_output_is_judged_and_reported() -> None:
    section = bundle.Section(
        ("devices: 1", "device: NVIDIA H100", "uuid: GPU-AB", "sms: 66", "alloc: 268435456", "ok"),
        0,
    )
    assert cuda.judge(section, "GPU-ab", "MPS active thread percentage 50") == (
        True,
        "NVIDIA H100 (GPU-AB), 66 SMs (MPS active thread percentage 50), allocated 256 MiB and "
        "ran a kernel on it",
    )
    assert cuda.judge(section, "GPU-other", "") == (
        False,
        "CUDA's device 0 is GPU-AB, not the granted GPU-other",
    )
    assert cuda.judge(section, "MIG-1", "")[0] is True  # CUDA names a MIG device otherwise
    failed = bundle.Section(("devices: 0", "error: cudaGetDeviceCount: no device"), 1)
    assert cuda.judge(failed, "GPU-AB", "") == (
        False,
        "exited with 1: cudaGetDeviceCount: no device",
    )
    assert cuda.judge(bundle.Section(("hello",), 0), "GPU-AB", "") == (
        True,
        "exited with 0: hello",
    )
    assert cuda.judge(None, "GPU-AB", "")[0] is False


def test_cuda_without_nvcc_or_a_program_is_none(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    monkeypatch.delenv("CUDA_HOME", raising=False)
    monkeypatch.delenv("CUDA_PATH", raising=False)
    monkeypatch.setattr(cuda, "NVCC_FALLBACKS", ())
    monkeypatch.setattr(locate, "SYSTEM_PATH", ())
    assert cuda.program("", str(tmp_path), ["9.0"]) == cuda.Program("", "")
    assert cuda.program(str(tmp_path / "nope"), str(tmp_path), []).problem == (
        f"{tmp_path / 'nope'} is not an executable file"
    )


def test_a_runtime_failure_is_one_line(tmp_path: Path) -> None:
    log = tmp_path / "log.json"
    log.write_text(
        json.dumps({"level": "warning", "msg": "ignored"})
        + "\n"
        + json.dumps({"level": "error", "msg": "runc create failed: error running hook #0"})
        + "\n"
    )
    assert lifecycle._failure("noise\ngpuhook: the one line\n", str(log), "x") == (
        "gpuhook: the one line"
    )
    assert lifecycle._failure("", str(log), "x") == "runc create failed: error running hook #0"
    text = 'time="2026" level=error msg="runc run failed: a \\"b\\""'
    assert lifecycle._failure(text + "\n", "", "x") == 'runc run failed: a "b"'
    assert lifecycle._failure("", "", "create exited with 1") == "create exited with 1"


def test_fixes_for_create_failures() -> None:
    config = f.config()
    assert session.fix_for(
        "gpuhook: the MPS control daemon of GPU 1 (group pair) is not running; start it: x",
        config,
    ) == "gpuhook mps start pair (or: systemctl start gpuhook-mps@pair)"
    assert session.fix_for("error running hook #0: fork/exec /x: permission denied", config) == (
        f"make {config.hook_path} executable (and {config.ldconfig}), or set hook.path in "
        f"{config.source}"
    )
    assert session.fix_for("something else", config).startswith("gpuhook doctor")


def test_the_table_puts_the_fix_after_a_failure_and_the_timings_below() -> None:
    results = [
        report.Result("runtime", report.PASS, "ok"),
        report.Result("gpu 0", report.FAIL, "create failed: x", "do y"),
        report.Result("mps", report.SKIP, "not configured", "configure it"),
    ]
    timings = [report.Timing("gpu 0", "id", 0.1204, 0.0404), report.Timing("k", "id2", 0.05, None)]
    view = report.view(results, timings, "/w", {"gpuhook-runtime": "/g", "runc": "/r"})
    assert view["ok"] is False and view["summary"] == {"pass": 1, "fail": 1, "skip": 1}
    assert view["containers"][0] == {
        "check": "gpu 0",
        "container_id": "id",
        "gpuhook_runtime_ms": 120.4,
        "runc_ms": 40.4,
    }
    assert report.table(view) == (
        "PASS  runtime  ok\n"
        "FAIL  gpu 0    create failed: x; fix: do y\n"
        "SKIP  mps      not configured; fix: configure it\n"
        "\n"
        "CONTAINER  GPUHOOK-RUNTIME  RUNC   DIFFERENCE\n"
        "gpu 0      120 ms           40 ms  +80 ms\n"
        "k          50 ms            -      -\n"
        "(the create call; gpuhook-runtime: /g, runc: plain /r on the same bundle)\n"
        "\n"
        "selftest: 1 failed, 1 passed, 1 skipped\n"
    )
