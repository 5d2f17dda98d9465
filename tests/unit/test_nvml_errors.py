"""An NVML failure becomes one line naming the call that failed, and NVML is shut down after
every session, failed or not (a stub module in place of pynvml). The bindings imported are used
only when their installed release is new enough: otherwise one line names what was found."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest

from gpuhook.errors import InventoryError, NvmlNotFoundError, describe
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


# --- which bindings: the pynvml imported must come from nvidia-ml-py >= PYNVML_MINIMUM ---------

NEEDED = (
    "gpuhook needs nvidia-ml-py >= 12.570 (pip install 'nvidia-ml-py>=12.570', "
    "or Debian: apt install python3-nvidia-ml-py)"
)


def stub_bindings(folder: Path, dist: str, version: str, layout: str) -> Path:
    """A stub pynvml in ``folder`` (a sys.path entry) with the metadata a package installer leaves
    beside it: ``dist-info`` (pip: METADATA and RECORD), ``egg-info`` (Debian's dh_python3: no
    file list, only top_level.txt), ``package`` (a pynvml/ package, as the old pynvml
    distribution shipped it) or ``bare`` (no metadata)."""
    folder.mkdir()
    module = folder / ("pynvml/__init__.py" if layout == "package" else "pynvml.py")
    module.parent.mkdir(exist_ok=True)
    module.write_text("nvmlLib = None\n")
    meta = f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n"
    stem = f"{dist.replace('-', '_')}-{version}"
    if layout in ("dist-info", "package"):
        info = folder / f"{stem}.dist-info"
        info.mkdir()
        (info / "METADATA").write_text(meta)
        record = module.relative_to(folder).as_posix()
        (info / "RECORD").write_text(f"{record},,\n{stem}.dist-info/METADATA,,\n")
    elif layout == "egg-info":
        info = folder / f"{stem}.egg-info"
        info.mkdir()
        (info / "PKG-INFO").write_text(meta)
        (info / "top_level.txt").write_text("pynvml\n")
    return module


def import_from(monkeypatch: pytest.MonkeyPatch, folder: Path) -> Any:
    monkeypatch.syspath_prepend(str(folder))
    monkeypatch.delitem(sys.modules, "pynvml", raising=False)
    return nvml._import_pynvml()


@pytest.mark.parametrize("layout", ["dist-info", "egg-info"])
def test_new_enough_bindings_are_used(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, layout: str
) -> None:
    module = stub_bindings(tmp_path / "site", "nvidia-ml-py", "12.570.86", layout)
    assert nvml.bindings_release(str(module)) == ("nvidia-ml-py", "12.570.86")
    assert import_from(monkeypatch, tmp_path / "site").__file__ == str(module)


@pytest.mark.parametrize(
    ("dist", "version", "layout", "found"),
    [
        ("nvidia-ml-py", "12.535.161", "dist-info", "are nvidia-ml-py 12.535.161"),
        ("nvidia-ml-py", "11.515.75", "egg-info", "are nvidia-ml-py 11.515.75"),
        ("pynvml", "11.5.0", "package", "are pynvml 11.5.0"),
        (
            "nvidia-ml-py",
            "12.570.86",
            "bare",
            "come with no package metadata (no .dist-info or .egg-info beside them)",
        ),
    ],
)
def test_other_bindings_are_refused_in_one_line(
    monkeypatch: pytest.MonkeyPatch,
    tmp_path: Path,
    dist: str,
    version: str,
    layout: str,
    found: str,
) -> None:
    module = stub_bindings(tmp_path / "site", dist, version, layout)
    with pytest.raises(NvmlNotFoundError) as info:
        import_from(monkeypatch, tmp_path / "site")
    assert describe(info.value) == (1, f"the Python NVML bindings {module} {found}: {NEEDED}")


def test_missing_bindings_are_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import pynvml raises ImportError
    with pytest.raises(NvmlNotFoundError) as info:
        nvml._import_pynvml()
    assert describe(info.value) == (
        1,
        f"the Python NVML bindings (module pynvml) are not installed: {NEEDED}",
    )


def test_release_tuple() -> None:
    assert nvml.release_tuple("12.570.86") == (12, 570, 86)
    assert nvml.release_tuple("12.570.0rc1") == (12, 570)
    assert nvml.release_tuple("12.535.161") < nvml.release_tuple(nvml.PYNVML_MINIMUM)
