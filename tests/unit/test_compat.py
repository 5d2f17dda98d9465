"""CUDA forward compatibility: the decision (versions compared as numbers, the note's branches and
GPU brands, the brands without a note) and reading an image for it without following its links
out of the rootfs (gpuhook.runtime.imagefs), down to NVIDIA's ELF note."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gpuhook.pipeline.compat import CompatLibrary, choose, note_fields, parse_version
from gpuhook.runtime import imagefs
from tests import driverimages

NOTE = {"Format": 1, "CUDA Version": "12.8", "Driver": [535, 550, 570], "Device": [2, 14]}
FOLDER = "/usr/local/cuda-12.8/compat"


def lib(
    version: str, drivers: tuple[int, ...] | None = None, brands: tuple[int, ...] | None = None
) -> CompatLibrary:
    return CompatLibrary(FOLDER, f"libcuda.so.{version}", version, drivers, brands)


@pytest.mark.parametrize(
    ("compat", "host", "brands", "why"),
    [
        (lib("575.57.08"), "550.54.15", [14], ""),
        (lib("570.124.06", (535, 550, 570)), "550.54.15", [14, 2], ""),
        (lib("550.90.07", (535, 550, 570)), "550.54.15", [14], ""),  # same branch, newer
        (lib("550.54.15"), "550.54.15", [14], "is not newer than the host driver 550.54.15"),
        (lib("535.216.03"), "550.54.15", [14], "is not newer than the host driver 550.54.15"),
        # "580.82.07" > "580.126.16" as strings; as numbers it is older (toolkit PR #1697)
        (lib("580.82.07", (580,)), "580.126.16", [14], "is not newer than the host driver"),
        (lib("570.124.06", (560, 570)), "550.54.15", [14],
         "does not support the host driver branch 550 (only 560, 570)"),
        (lib("550.90.07"), "550.54.15", [14],
         "no forward compatibility note and is of the host driver's branch 550"),
        (lib("575.57.08"), "550.54.15", [14, 5], "not supported on GeForce GPUs"),
        (lib("575.57.08"), "550.54.15", [0], "not supported on unknown GPUs"),
        (lib("570.124.06", (550,), (2,)), "550.54.15", [14], "not supported on NVIDIA GPUs"),
        (lib("575"), "550.54.15", [14], "has no driver version in its name"),
        (lib("575.57.08"), "", [14], "the host driver version '' is unknown"),
        (CompatLibrary(FOLDER, problem=f"{FOLDER} holds 2 libcuda versions"), "550.54.15", [14],
         "holds 2 libcuda"),
    ],
)  # fmt: skip
def test_the_folder_goes_first_only_when_it_may(
    compat: CompatLibrary, host: str, brands: list[int], why: str
) -> None:
    choice = choose(compat, host, brands)
    if not why:
        assert choice.folder == FOLDER
        assert choice.note.what.endswith(f"{FOLDER} first in the ld.so.cache")
        assert f"{compat.file} is newer than the host driver {host}" in choice.note.why
    else:
        assert choice.folder == ""
        assert choice.note.what.endswith(": not used")
        assert why in choice.note.why


def test_versions_and_notes_parse_strictly() -> None:
    assert parse_version("580.126.16") == (580, 126, 16)
    assert parse_version("575.57") == (575, 57)
    for bad in ("", "575", "575.x", "1.2.3.4.5", "\uff15\uff17\uff15.1"):  # fullwidth digits
        assert parse_version(bad) is None
    assert note_fields(b'{"Driver": [535, 550], "Device": [1, 2]}\0\0') == ((535, 550), (1, 2))
    assert note_fields(b'{"Driver": "550"}') == (None, None)
    assert note_fields(b"not json") == (None, None)


# --- reading the image --------------------------------------------------------------------------


def test_open_dir_resolves_links_inside_the_rootfs_and_never_leaves_it(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "real/deeper").mkdir(parents=True)
    (root / "abs").symlink_to("/real")  # absolute: from the rootfs
    (root / "rel").symlink_to("real/../real/deeper")
    (root / "out").symlink_to("/../../../../" + str(tmp_path).lstrip("/"))  # climbs: stays
    (root / "loop").symlink_to("loop")
    (root / "file").write_text("x")
    fd = imagefs.open_root(str(root))
    try:
        for path, want in (("/abs/deeper", "/real/deeper"), ("/rel", "/real/deeper"), ("/", "/")):
            dfd, resolved = imagefs.open_dir(fd, path)
            assert resolved == want
            assert os.path.samestat(os.fstat(dfd), os.stat(root / want.lstrip("/")))
            os.close(dfd)
        with pytest.raises(FileNotFoundError):  # tmp_path inside the rootfs: not there
            imagefs.open_dir(fd, "/out/rootfs")
        with pytest.raises(OSError, match="too many levels"):
            imagefs.open_dir(fd, "/loop")
        with pytest.raises(NotADirectoryError):
            imagefs.open_dir(fd, "/file")
    finally:
        os.close(fd)


def test_compat_library_reads_the_version_and_the_note(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    driverimages.install_compat(root, "570.124.06", NOTE)
    assert imagefs.compat_library(str(root)) == CompatLibrary(
        FOLDER, "libcuda.so.570.124.06", "570.124.06", (535, 550, 570), (2, 14)
    )
    bare = tmp_path / "bare"
    driverimages.install_compat(bare, "575.57.08", None)
    assert imagefs.compat_library(str(bare)) == CompatLibrary(
        FOLDER, "libcuda.so.575.57.08", "575.57.08"
    )


def test_compat_library_none_or_a_problem(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    root.mkdir()
    assert imagefs.compat_library(str(root)) is None  # no /usr/local/cuda
    assert imagefs.compat_library(str(tmp_path / "missing")) is None
    driverimages.install_compat(root, "570.124.06", None)
    folder = root / FOLDER.lstrip("/")
    (folder / "libcuda.so.575.1").symlink_to("/etc/passwd")  # a link of the image: never opened
    found = imagefs.compat_library(str(root))
    assert found is not None and found.problem == f"{FOLDER} holds 2 libcuda versions"
    (folder / "libcuda.so.570.124.06").unlink()
    found = imagefs.compat_library(str(root))
    assert found is not None
    assert found.problem == f"{FOLDER}/libcuda.so.575.1 unreadable: not a regular file"
    (folder / "libcuda.so.575.1").unlink()
    os.mkfifo(folder / "libcuda.so.575.2")  # would block a reader
    found = imagefs.compat_library(str(root))
    assert found is not None and "not a regular file" in found.problem


def test_make_links_inside_the_rootfs(tmp_path: Path) -> None:
    root = tmp_path / "rootfs"
    (root / "lib").mkdir(parents=True)
    (root / "lib/taken").write_text("x")
    problems = imagefs.make_links(
        str(root),
        [("/lib/a.so", "a.so.1"), ("/lib/a.so", "a.so.1"), ("/lib/taken", "t"), ("/no/b", "b")],
    )
    assert os.readlink(root / "lib/a.so") == "a.so.1"
    assert problems == [
        "/lib/taken: exists and is not a link",
        "/no/b: /no No such file or directory",
    ]


# --- at create time -----------------------------------------------------------------------------


def _decide(*env: str, brand: int = 14, **cfg: object) -> tuple[list[str], list[str], list[str]]:
    """(the hook's folders, the notes' texts, the rootfs the compat source was asked about)."""
    from gpuhook.runtime import decide
    from tests import factories as f

    asked: list[str] = []

    def source(rootfs: str) -> CompatLibrary:
        asked.append(rootfs)
        return lib("570.124.06", (535, 550, 570))

    inventory = f.inventory(2, brand=brand)
    out = decide.run(
        f.spec(env=list(env)),
        f.config(**cfg),
        inventory_source=lambda _c: inventory,
        rootfs="/run/c1/rootfs",
        compat_source=source,
    )
    hooks = out.spec.get("hooks", {}).get("createContainer", [])
    args = hooks[0]["args"] if hooks else []
    folders = [args[i + 1] for i, a in enumerate(args) if a == "--folder"]
    return folders, [f"{n.what}: {n.why}" for n in out.edits.notes], asked


def test_create_time_decision_puts_the_folder_first_and_says_why() -> None:
    folders, notes, asked = _decide("NVIDIA_VISIBLE_DEVICES=1")
    assert folders == [FOLDER, "/usr/local/gpuhook/lib"]
    assert asked == ["/run/c1/rootfs"]
    assert any(
        n.startswith(f"CUDA forward compatibility (/usr/local/cuda/compat): {FOLDER}")
        for n in notes
    )
    folders, notes, _ = _decide("NVIDIA_VISIBLE_DEVICES=1", brand=5)
    assert folders == ["/usr/local/gpuhook/lib"]
    assert any("not supported on GeForce GPUs" in n for n in notes)


def test_the_image_is_not_read_where_compat_cannot_apply() -> None:
    for env, cfg in (
        (["NVIDIA_VISIBLE_DEVICES=1"], {"inject__cuda_compat": False}),
        (["NVIDIA_VISIBLE_DEVICES=none"], {}),  # no GPU
        (["NVIDIA_VISIBLE_DEVICES=1", "NVIDIA_DRIVER_CAPABILITIES=utility"], {}),  # no libcuda
        ([], {}),  # no request
    ):
        _folders, notes, asked = _decide(*env, **cfg)
        assert asked == [] and not [n for n in notes if n.startswith("CUDA")], env
