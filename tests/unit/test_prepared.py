"""The driver's library folders prepared on the host (gpuhook.runtime.prepared) and the edits
that use them (gpuhook.pipeline.driverfiles): one read-only bind per library folder, no links for
the hook to make, its prepared ldconfig entries named; the folder made on disk as the container
sees it; old generations removed only when nothing holds them. Real containers:
tests/integration/test_prepared_driver_files.py."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from gpuhook.engines import cdi
from gpuhook.model.edits import Mount
from gpuhook.pipeline import driverfiles
from gpuhook.runtime import decide, prepared
from tests import factories as f

LIB = "/usr/local/gpuhook/lib"
HOST = "/var/lib/gpuhook/driverfiles/0123456789abcdef/compute+utility"


def _spec(inventory: Any, *env: str) -> dict[str, Any]:
    out = decide.run(
        f.spec(env=["NVIDIA_VISIBLE_DEVICES=0", *env]),
        f.config(),
        inventory_source=lambda _c: inventory,
        rootfs="/rootfs",
    )
    return out.spec


def test_a_prepared_set_is_one_read_only_bind_and_the_hook_reads_its_entries() -> None:
    inventory = f.inventory(2).replace(prepared=(("compute,utility", HOST),))
    spec = _spec(inventory)
    lib = [m for m in spec["mounts"] if m["destination"].startswith(LIB)]
    assert lib == [
        {
            "destination": LIB,
            "type": "bind",
            "source": f"{HOST}/lib",
            "options": list(driverfiles.RO_BIND),
        }
    ]
    args = spec["hooks"]["createContainer"][0]["args"]
    assert "--link" not in args  # the links are in the prepared folder
    assert args[args.index("--cache") + 1] == f"{LIB}={HOST}/lib.ldcache"
    binaries = [m for m in spec["mounts"] if m["destination"].startswith("/usr/bin/")]
    assert binaries  # what is not a library folder keeps its bind per file


def test_a_set_that_was_not_prepared_gets_a_bind_per_file() -> None:
    inventory = f.inventory(2).replace(prepared=(("compute,utility", HOST),))
    spec = _spec(inventory, "NVIDIA_DRIVER_CAPABILITIES=compute,utility,video")
    lib = [m for m in spec["mounts"] if m["destination"].startswith(LIB)]
    assert lib[0] == {
        "destination": LIB,
        "type": "tmpfs",
        "source": "tmpfs",
        "options": list(driverfiles.TMPFS_OPTIONS),
    }
    assert len(lib) > 4 and "--cache" not in spec["hooks"]["createContainer"][0]["args"]


def test_the_cdi_spec_keeps_its_binds_per_file() -> None:
    """The CDI spec is written once and may outlive a driver's prepared folders."""
    config = f.config()
    inventory = f.inventory(2).replace(prepared=(("compute,utility", HOST),))
    edits = cdi.common_edits(inventory, config)
    assert not [m for m in edits.mounts if m.host_path.startswith(HOST)]


def test_a_set_is_made_as_the_container_sees_it(tmp_path: Path) -> None:
    driver = tmp_path / "driver"
    driver.mkdir()
    (driver / "libcuda.so.550.1").write_bytes(b"\x7fELF cuda")
    (driver / "libcuda.so.550.1").chmod(0o755)
    plan = driverfiles.DriverFiles(
        mounts=(
            Mount("tmpfs", LIB, "tmpfs", driverfiles.TMPFS_OPTIONS),
            Mount(str(driver / "libcuda.so.550.1"), f"{LIB}/libcuda.so.550.1"),
            Mount(str(driver / "libcuda.so.550.1"), f"{LIB}/libcuda.so.1"),
            Mount("tmpfs", f"{LIB}/gbm", "tmpfs", driverfiles.TMPFS_OPTIONS),
        ),
        folders=(LIB,),
        links=(f"{LIB}/libcuda.so=libcuda.so.1", f"{LIB}/gbm/nvidia-drm_gbm.so=../libcuda.so.1"),
        env=(),
        notes=(),
    )
    ldconfig = tmp_path / "ldconfig"  # writes the folder's cache where the real one does
    ldconfig.write_text("#!/bin/sh\necho entries > ./.gpuhook-ld.so.cache\n")
    ldconfig.chmod(0o755)
    dest = tmp_path / "set"
    prepared.materialize(plan, f.config(hook__ldconfig=str(ldconfig)), str(dest))
    lib = dest / "lib"
    assert sorted(os.listdir(lib)) == ["gbm", "libcuda.so", "libcuda.so.1", "libcuda.so.550.1"]
    assert os.readlink(lib / "libcuda.so") == "libcuda.so.1"
    assert os.readlink(lib / "gbm/nvidia-drm_gbm.so") == "../libcuda.so.1"
    same = (driver / "libcuda.so.550.1").stat()
    assert (lib / "libcuda.so.1").stat().st_ino == same.st_ino  # a hard link: the same file
    assert (dest / "lib.ldcache/.gpuhook-ld.so.cache").read_text() == "entries\n"
    assert not (lib / ".gpuhook-ld.so.cache").exists()


def test_old_generations_are_removed_only_when_nothing_holds_them(tmp_path: Path) -> None:
    root = tmp_path / "driverfiles"
    for n, name in enumerate(["a1", "b2", "c3", "d4"]):
        (root / name / "set").mkdir(parents=True)
        os.utime(root / name, (1000 + n, 1000 + n))
    (root / ".tmp-999999999-00").mkdir()  # a builder that is gone
    (root / f".tmp-{os.getpid()}-00").mkdir()  # one still at work
    removed = prepared.collect(str(root), "a1")
    # the current one, the newest other one (a create may hold an inventory naming it) stay
    assert sorted(removed) == [".tmp-999999999-00", "b2", "c3"]
    assert sorted(os.listdir(root)) == [f".tmp-{os.getpid()}-00", "a1", "d4"]


def test_a_generation_that_is_gone_gives_per_file_mounts(tmp_path: Path) -> None:
    """A state folder wiped under the inventory: creates bind the files, never a missing folder."""
    gone = str(tmp_path / "driverfiles/0123/compute+utility")
    inventory = f.inventory(2).replace(prepared=(("compute,utility", gone),))
    assert decide._present(inventory).prepared == ()
    os.makedirs(gone)
    assert decide._present(inventory) is inventory


def test_the_32_bit_folder_is_its_own_bind_with_its_own_entries() -> None:
    from gpuhook.model.inventory import Library

    cuda32 = Library("libcuda.so.550.1", "/d/lib32/libcuda.so.550.1", "libcuda.so.1", "550.1",
                     "compat32")  # fmt: skip
    base = f.inventory(2)
    inventory = base.replace(
        libraries=(*base.libraries, cuda32), prepared=(("compat32,compute,utility", HOST),)
    )
    spec = _spec(inventory, "NVIDIA_DRIVER_CAPABILITIES=compute,utility,compat32")
    lib = {
        m["destination"]: m["source"] for m in spec["mounts"] if m["destination"].startswith(LIB)
    }
    assert lib == {LIB: f"{HOST}/lib", LIB + "32": f"{HOST}/lib32"}
    args = spec["hooks"]["createContainer"][0]["args"]
    caches = [args[i + 1] for i, a in enumerate(args) if a == "--cache"]
    assert caches == [f"{LIB}={HOST}/lib.ldcache", f"{LIB}32={HOST}/lib32.ldcache"]
