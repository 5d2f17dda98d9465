"""An NVML failure becomes one line naming the call that failed, and NVML is shut down after
every session, failed or not (a stub module in place of pynvml)."""

from __future__ import annotations

from typing import Any

import pytest

from gpuhook.errors import InventoryError
from gpuhook.inventory import nvml


class StubNvml:
    class NVMLError(Exception):
        pass

    def __init__(self, failing: str = "") -> None:
        self.failing = failing
        self.calls: list[str] = []

    def __getattr__(self, name: str) -> Any:
        def call(*args: Any) -> Any:
            self.calls.append(name)
            if name == self.failing:
                raise self.NVMLError("Unknown Error")
            return {
                "nvmlSystemGetDriverVersion": b"550.54.15",
                "nvmlSystemGetCudaDriverVersion": 12040,
                "nvmlDeviceGetCount": 0,
                "nvmlDeviceGetComputeMode": 3,
            }.get(name)

        return call


def use(monkeypatch: pytest.MonkeyPatch, stub: StubNvml) -> None:
    monkeypatch.setattr(nvml, "load_library", lambda *_: (stub, "/stub/libnvidia-ml.so.1"))


@pytest.mark.parametrize(
    ("failing", "message"),
    [
        ("nvmlInit", "NVML nvmlInit failed: Unknown Error"),
        (
            "nvmlSystemGetCudaDriverVersion",
            "NVML nvmlSystemGetCudaDriverVersion failed: Unknown Error",
        ),
        ("nvmlShutdown", "NVML nvmlShutdown failed: Unknown Error"),
    ],
)
def test_query_names_the_failing_call(
    monkeypatch: pytest.MonkeyPatch, failing: str, message: str
) -> None:
    stub = StubNvml(failing)
    use(monkeypatch, stub)
    with pytest.raises(InventoryError) as info:
        nvml.query("", [])
    assert str(info.value) == message
    assert stub.calls[-1] == ("nvmlInit" if failing == "nvmlInit" else "nvmlShutdown")


def test_compute_modes_and_their_failures(monkeypatch: pytest.MonkeyPatch) -> None:
    stub = StubNvml()
    use(monkeypatch, stub)
    assert nvml.query("", []).driver_version == "550.54.15"
    assert nvml.compute_modes("", [], ["GPU-a"]) == {"GPU-a": "EXCLUSIVE_PROCESS"}
    stub = StubNvml("nvmlDeviceSetComputeMode")
    use(monkeypatch, stub)
    with pytest.raises(InventoryError) as info:
        nvml.set_compute_mode("", [], ["GPU-a"], "EXCLUSIVE_PROCESS")
    assert str(info.value) == (
        "NVML nvmlDeviceSetComputeMode(GPU-a, EXCLUSIVE_PROCESS) failed: Unknown Error"
    )
    assert stub.calls[-1] == "nvmlShutdown"  # shut down after the failure too
