"""Issue 36.1 in the pure parts: reading an image's forward compatibility libcuda is bounded by
what a real library needs (reads and bytes counted, whatever its headers claim), and the image is
read before MPS admission takes the node-wide accounting lock."""

from __future__ import annotations

import io
import os
from pathlib import Path
from typing import Any

import pytest

from gpuhook.inventory import elf
from gpuhook.mps import folders
from gpuhook.pipeline.compat import NOTE_OWNER, NOTE_SECTION, CompatLibrary
from gpuhook.runtime import imagefs
from tests import driverimages, factories, hostile_elf


class Counted(io.FileIO):
    """A file that counts the reads made of it and the bytes they returned."""

    reads = 0
    returned = 0

    def read(self, size: int | None = -1) -> bytes:
        data = super().read(size)
        self.reads += 1
        self.returned += len(data or b"")
        return data or b""


def note_reads(path: Path) -> tuple[int, int, str]:
    """(reads, bytes read, the outcome) of looking up the compat note in ``path``."""
    with Counted(path, "r") as f:
        try:
            outcome = repr(elf.note_from_file(f, path.stat().st_size, NOTE_SECTION, NOTE_OWNER))
        except elf.ElfError as exc:
            outcome = str(exc)
        return f.reads, f.returned, outcome


@pytest.mark.parametrize(
    ("sections", "outcome"),
    [
        (hostile_elf.SECTIONS, f"{hostile_elf.SECTIONS} section headers is more than a shared "
         "library has (at most 1024)"),
        (1024, "None"),  # as many as accepted, every one named by the 65,535-byte name
    ],
)  # fmt: skip
def test_the_crafted_library_costs_a_few_bounded_reads(
    tmp_path: Path, sections: int, outcome: str
) -> None:
    """Before: one 256-byte read per section per 256 bytes of its name (107 million reads for
    the issue's file, a minute of CPU)."""
    path = tmp_path / "libcuda.so.999.1"
    hostile_elf.write(path, sections)
    reads, returned, got = note_reads(path)
    assert got == outcome
    assert reads <= 5 and returned <= 200 << 10, (reads, returned)


def test_a_real_library_note_is_still_found_in_the_same_few_reads(tmp_path: Path) -> None:
    note = {"Format": 1, "CUDA Version": "12.8", "Driver": [535, 550], "Device": [2, 14]}
    lib = driverimages.install_compat(tmp_path / "rootfs", "570.124.06", note)
    reads, returned, got = note_reads(lib)
    assert got.startswith("b'") and reads <= 5 and returned < 64 << 10
    found = imagefs.compat_library(str(tmp_path / "rootfs"))
    assert found is not None and found.drivers == (535, 550) and found.brands == (2, 14)


def test_the_image_is_read_before_mps_admission_takes_its_lock() -> None:
    """``mps_admit`` takes the node-wide accounting lock (held until the record is written):
    the image's compat library is asked for before it, never under it."""
    from gpuhook.pipeline import flow

    calls: list[str] = []
    inventory = factories.inventory(2)

    def compat(_rootfs: str) -> CompatLibrary | None:
        calls.append("image")
        return None

    def admit(_plan: Any) -> None:
        calls.append("admission (locked)")

    out = flow.run(
        factories.spec(env=["NVIDIA_VISIBLE_DEVICES=0"]),
        factories.config(mps__gpus=["0"], mps__replicas=2),
        inventory_source=lambda _c: inventory,
        checkpoint_source=lambda *_a: pytest.fail("no checkpoint for a standalone container"),
        mps_probe=lambda _pipe: 4242,
        mps_admit=admit,
        rootfs="/run/c1/rootfs",
        compat_source=compat,
    )
    assert out.mps is not None and calls == ["image", "admission (locked)"]


# --- 36.5: removing a folder tenants wrote -------------------------------------------------------


def nest(top: Path, depth: int) -> Path:
    """``depth`` nested folders under ``top`` (made by descriptor: no path grows); the deepest."""
    fd = os.open(top, os.O_RDONLY | os.O_DIRECTORY)
    for _ in range(depth):
        os.mkdir("d", dir_fd=fd)
        inner = os.open("d", os.O_RDONLY | os.O_DIRECTORY, dir_fd=fd)
        os.close(fd)
        fd = inner
    (Path(f"/proc/self/fd/{fd}") / "file").write_text("x")
    os.close(fd)
    return top


def open_fds() -> set[str]:
    return set(os.listdir("/proc/self/fd"))


def test_a_deep_tree_is_removed_without_recursion_or_following_links(tmp_path: Path) -> None:
    """5,000 nested folders (Python's recursion limit is 1,000; RLIMIT_NOFILE often 1,024), links
    to a host folder and file at several depths: all removed, the link targets untouched, at
    most 64 folders open at once."""
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    top = tmp_path / "pipe.old-1"
    top.mkdir()
    nest(top, 5000)
    (top / "link").symlink_to(keep)
    (top / "d" / "d" / "file-link").symlink_to(keep / "precious")
    before = open_fds()
    removed = folders.remove_tree(str(top))
    assert removed >= 5003 and not top.exists()
    assert (keep / "precious").read_text() == "x"
    assert open_fds() - before == set()  # none left open (others may close meanwhile: GC)


def test_removal_is_bounded(tmp_path: Path) -> None:
    top = tmp_path / "pipe.old-2"
    top.mkdir()
    for i in range(50):
        (top / f"f{i}").write_text("")
    with pytest.raises(OSError, match="more than 20 entries"):
        folders.remove_tree(str(top), limit=20)
    assert top.exists()  # what is left stays, reported; the next start tries again


def test_a_link_in_place_of_the_folder_is_unlinked_never_followed(tmp_path: Path) -> None:
    keep = tmp_path / "keep"
    keep.mkdir()
    (keep / "precious").write_text("x")
    pipe = tmp_path / "pipe"
    pipe.symlink_to(keep)
    assert folders.clear(str(pipe)) == []
    assert not os.path.lexists(pipe) and (keep / "precious").read_text() == "x"


def test_a_start_that_fails_after_setting_exclusive_puts_default_back(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """Whatever stops a new daemon after its GPUs were put in EXCLUSIVE_PROCESS (the issue's
    RecursionError, here raised on purpose), DEFAULT is put back: never a GPU no process can
    use. Before, only gpuhook's own MpsError did."""
    from gpuhook.mps import daemons
    from gpuhook.pipeline import sharing

    config = factories.config(mps__gpus=["0"], mps__root=str(tmp_path / "mps"))
    inventory = factories.inventory(1)
    monkeypatch.setattr(daemons, "binary", lambda _inventory: "/bin/false")
    (group,) = sharing.resolve_groups(config.mps, inventory, "test")
    daemon = daemons.Daemon(config, inventory, group)
    modes: list[str] = []

    def fails() -> int:
        raise RecursionError("maximum recursion depth exceeded")

    monkeypatch.setattr(daemon, "_compute_mode", modes.append)
    monkeypatch.setattr(daemon, "pid", lambda: None)
    monkeypatch.setattr(daemon, "_own_folders", lambda **_kw: [])
    monkeypatch.setattr(daemon, "_start_new", fails)
    with pytest.raises(RecursionError):
        daemon.start()
    assert modes == ["EXCLUSIVE_PROCESS", "DEFAULT"]
    assert not os.path.lexists(daemon.mode_record)


def test_a_compat_folder_of_many_entries_is_listed_only_so_far(tmp_path: Path) -> None:
    """The image's compat folder is listed up to imagefs.MAX_COMPAT_ENTRIES entries: past
    that, one reason line (the host's libcuda is used), not a listing as long as the image
    makes it."""
    root = tmp_path / "rootfs"
    driverimages.install_compat(root, "570.124.06", None)
    folder = root / "usr/local/cuda-12.8/compat"
    for i in range(imagefs.MAX_COMPAT_ENTRIES):
        (folder / f"junk{i}").touch()
    found = imagefs.compat_library(str(root))
    assert found is not None
    assert found.problem == (
        f"/usr/local/cuda-12.8/compat holds more than {imagefs.MAX_COMPAT_ENTRIES} entries"
    )
