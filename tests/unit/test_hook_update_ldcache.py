"""`... hook update-ldcache`, as runc runs it: through the static dispatcher (``gpuhook-runtime
hook update-ldcache``, which runs the --rootfs form itself, without a shell or Python) and through
the Python implementation (``gpuhook hook update-ldcache``). Both must start the same ldconfig
command lines, with the same explicit environment, working folder and bounds, write the same
cache bytes, and report the same outcomes.

A fake ldconfig (a sh script) records every run; when it is run the way the merge runs it on
an injected folder (``-C /.gpuhook-ld.so.cache``, its working folder the injected one, where the
real one chroots), it writes the cache the test prepared there, as the real one would. The real
ldconfig inside real containers: tests/integration/test_ldcache_merge.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuhook.inventory import ldcache
from gpuhook.inventory.ldcache import CacheEntry
from gpuhook.runtime import decide, ldmerge, ldrun
from tests import factories as f

REPO = Path(__file__).resolve().parents[2]
RUNTIME = REPO / "build" / "bin" / "gpuhook-runtime"
CLI_ENTRY = REPO / "src" / "gpuhook" / "_cli_entry.py"
FOLDER = "/usr/local/gpuhook/lib"
X86_64 = 0x0303
STATE = '{"ociVersion":"1.0.2","id":"c-hook","status":"creating","bundle":"/nonexistent"}'

# How runc starts the hook: the spec's explicit env, plus whatever a hostile spec could add.
HOOK_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LD_LIBRARY_PATH": "/nonexistent", "FOO": "1"}


@pytest.fixture(autouse=True)
def _own_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config whose log file is the test's (the default one logs to /var/log/gpuhook)."""
    from tests.logcapture import paper_node

    monkeypatch.setitem(HOOK_ENV, "GPUHOOK_CONFIG", str(paper_node(tmp_path / "node")))
    # as gpuhook-runtime passes its cache folder on (Config.propagated_env): the session's
    monkeypatch.setitem(HOOK_ENV, "GPUHOOK_CACHE_DIR", os.environ["GPUHOOK_CACHE_DIR"])


IMPLS = pytest.mark.parametrize(
    "impl",
    [[str(RUNTIME)], [sys.executable, "-I", "-S", str(CLI_ENTRY)]],
    ids=["static-dispatcher", "python"],
)


class Fake:
    """The fake ldconfig at ``path``: every run appends its argv, its initial environment
    (/proc/self/environ: exactly what exec passed), its physical working folder and its heap
    and CPU limits to ``runs``; it exits with the content of ``rc`` (0 without), sleeps
    ``sleep`` seconds instead (killed at the bound), and on a folder run copies
    ``folder_cache`` (when there is one) to ./.gpuhook-ld.so.cache."""

    def __init__(self, folder: Path) -> None:
        self.path = folder / "ldconfig"
        self.log = folder / "runs"
        self.rc = folder / "rc"
        self.sleep = folder / "sleep"
        self.folder_cache = folder / "folder-cache"
        self.path.write_text(
            "#!/bin/sh\n"
            f"exec 3>>{self.log}\n"
            'printf "%s\\n" "$@" >&3\n'
            "echo --- >&3\n"
            "tr '\\0' '\\n' < /proc/$$/environ >&3\n"
            "echo --- >&3\n"
            "pwd -P >&3\n"
            "ulimit -d >&3; ulimit -t >&3\n"
            "echo === >&3\n"
            f"[ -f {self.sleep} ] && exec sleep $(cat {self.sleep})\n"
            f'case " $* " in *" -C /{ldmerge.FOLDER_CACHE} "*)\n'
            f"  [ -f {self.folder_cache} ] && cp {self.folder_cache} ./{ldmerge.FOLDER_CACHE} ;;\n"
            "esac\n"
            f"exit $(cat {self.rc} 2>/dev/null || echo 0)\n"
        )
        self.path.chmod(0o755)

    def runs(self) -> list[dict[str, Any]]:
        if not self.log.exists():
            return []
        out: list[dict[str, Any]] = []
        for text in self.log.read_text().split("===\n")[:-1]:
            argv, env, rest = text.split("---\n")
            cwd, data, cpu = rest.split()
            environ = dict(line.split("=", 1) for line in env.splitlines() if line)
            environ.pop("PWD", None)  # the fake ldconfig is a sh script: dash sets PWD itself
            limits = (data, cpu)
            out.append({"argv": argv.splitlines(), "env": environ, "cwd": cwd, "limits": limits})
        return out


@pytest.fixture
def fake(tmp_path: Path) -> Fake:
    return Fake(tmp_path)


def _run(
    impl: list[str], *args: str, stdin: str = STATE, timeout: float = 30
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*impl, "hook", "update-ldcache", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env=HOOK_ENV,
        cwd="/tmp",
        timeout=timeout,
        check=False,
    )


def _rootfs(tmp_path: Path, *folders: str) -> Path:
    rootfs = tmp_path / "rootfs"
    for folder in (FOLDER, *folders):
        (rootfs / folder.lstrip("/")).mkdir(parents=True, exist_ok=True)
    (rootfs / "etc").mkdir(exist_ok=True)
    return rootfs


def _entry(key: str, value: str, flags: int = X86_64, osversion: int = 0) -> CacheEntry:
    return CacheEntry(key, value, flags, None, 0, osversion)


def _cache(rootfs: Path) -> list[tuple[str, str, int]]:
    return [(e.key, e.value, e.flags) for e in ldcache.read(str(rootfs / "etc/ld.so.cache"))]


FULL = ["-X", "-r"]  # the full run's first arguments, then the rootfs and the folders
FOLDER_RUN = list(ldmerge.FOLDER_FLAGS)
SAFE_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}
BOUNDS = (str(ldrun.LDCONFIG_DATA_LIMIT >> 10), str(ldrun.LDCONFIG_CPU_S))


# --- the merge: the image's cache kept, the injected folders' entries first ----------------------


IMAGE = [
    _entry("libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1"),
    _entry("libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", osversion=0x30200),
    _entry("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1"),
    _entry("libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1", 0x0003),
    _entry("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6"),
    _entry("libc.so.6", f"{FOLDER}/libc.so.6"),  # an image committed from a GPU container
]
FOLDER_CACHE = [  # what ldconfig, chrooted into the folder, lists ("/./" + name)
    _entry("libnvidia-ml.so.1", "/./libnvidia-ml.so.1"),
    _entry("libnvidia-ml.so", "/./libnvidia-ml.so"),
    _entry("libcuda.so.1", "/./libcuda.so.1"),
    _entry("libcuda.so", "/./libcuda.so"),
    _entry("libc.so.6", "/./libc.so.6"),
]


@IMPLS
def test_the_injected_entries_go_first_and_the_images_stay_as_they_are(
    impl: list[str], fake: Fake, tmp_path: Path
) -> None:
    rootfs = _rootfs(tmp_path)
    (rootfs / "etc/ld.so.cache").write_bytes(ldcache.serialize(IMAGE))
    fake.folder_cache.write_bytes(ldcache.serialize(FOLDER_CACHE))
    args = ["--ldconfig", str(fake.path), "--rootfs", str(rootfs), "--folder", FOLDER]
    result = _run(impl, *args)
    assert (result.returncode, result.stderr) == (0, "")
    [run] = fake.runs()  # one ldconfig, on the folder alone: no full run
    assert run == {
        "argv": FOLDER_RUN,
        "env": SAFE_ENV,
        "cwd": str(rootfs / FOLDER.lstrip("/")),  # where the real one chroots (-r .)
        "limits": BOUNDS,
    }
    assert _cache(rootfs) == [
        ("libz.so.1", "/lib/x86_64-linux-gnu/libz.so.1", X86_64),
        ("libnvidia-ml.so.1", f"{FOLDER}/libnvidia-ml.so.1", X86_64),  # before the image's
        ("libnvidia-ml.so.1", "/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1", X86_64),
        ("libnvidia-ml.so", f"{FOLDER}/libnvidia-ml.so", X86_64),
        ("libcuda.so.1", f"{FOLDER}/libcuda.so.1", X86_64),
        ("libcuda.so.1", "/usr/lib/x86_64-linux-gnu/libcuda.so.1", X86_64),
        ("libcuda.so.1", "/usr/lib/i386-linux-gnu/libcuda.so.1", 0x0003),
        ("libcuda.so", f"{FOLDER}/libcuda.so", X86_64),
        ("libc.so.6", f"{FOLDER}/libc.so.6", X86_64),  # listed once
        ("libc.so.6", "/lib/x86_64-linux-gnu/libc.so.6", X86_64),
    ]
    kept = ldcache.read(str(rootfs / "etc/ld.so.cache"))
    assert kept[2].osversion == 0x30200  # the image's entries as they were, field by field
    assert sorted(os.listdir(rootfs / FOLDER.lstrip("/"))) == []  # ldconfig's cache removed
    assert sorted(os.listdir(rootfs / "etc")) == ["ld.so.cache"]
    assert (rootfs / "etc/ld.so.cache").stat().st_mode & 0o777 == 0o644


def test_both_implementations_write_the_same_bytes(fake: Fake, tmp_path: Path) -> None:
    fake.folder_cache.write_bytes(ldcache.serialize(FOLDER_CACHE))
    written = []
    for n, impl in enumerate(([str(RUNTIME)], [sys.executable, "-I", "-S", str(CLI_ENTRY)])):
        rootfs = _rootfs(tmp_path / str(n), FOLDER + "32")
        (rootfs / "etc/ld.so.cache").write_bytes(ldcache.serialize(IMAGE))
        args = ["--ldconfig", str(fake.path), "--rootfs", str(rootfs)]
        result = _run(impl, *args, "--folder", FOLDER, "--folder", FOLDER + "32")
        assert (result.returncode, result.stderr) == (0, "")
        written.append((rootfs / "etc/ld.so.cache").read_bytes())
    assert written[0] == written[1]
    merged = ldcache.parse(written[0])
    # the same sonames in both folders: the first folder's entry first
    assert [e.value for e in merged if e.key == "libcuda.so.1"][:2] == [
        f"{FOLDER}/libcuda.so.1",
        f"{FOLDER}32/libcuda.so.1",
    ]


@IMPLS
def test_a_prepared_folder_runs_no_ldconfig_and_merges_its_prepared_entries(
    impl: list[str], fake: Fake, tmp_path: Path
) -> None:
    """``--cache FOLDER=DIR``: the folder's entries were listed when gpuhook prepared it on the
    host (its bind mount is read-only): they are read from DIR, kept there, and merged as a
    folder run's; the other folders still get their ldconfig run."""
    rootfs = _rootfs(tmp_path, FOLDER + "32")
    (rootfs / "etc/ld.so.cache").write_bytes(ldcache.serialize(IMAGE))
    prepared = tmp_path / "prepared" / "lib.ldcache"
    prepared.mkdir(parents=True)
    (prepared / ldmerge.FOLDER_CACHE).write_bytes(ldcache.serialize(FOLDER_CACHE))
    fake.folder_cache.write_bytes(ldcache.serialize(FOLDER_CACHE[4:]))
    args = ["--ldconfig", str(fake.path), "--rootfs", str(rootfs), "--folder", FOLDER]
    args += ["--folder", FOLDER + "32", "--cache", f"{FOLDER}={prepared}"]
    result = _run(impl, *args)
    assert (result.returncode, result.stderr) == (0, "")
    assert [r["cwd"] for r in fake.runs()] == [str(rootfs / (FOLDER + "32").lstrip("/"))]
    cache = _cache(rootfs)
    assert cache[1] == ("libnvidia-ml.so.1", f"{FOLDER}/libnvidia-ml.so.1", X86_64)
    assert ("libcuda.so", f"{FOLDER}/libcuda.so", X86_64) in cache
    assert ("libc.so.6", f"{FOLDER}32/libc.so.6", X86_64) in cache
    assert os.listdir(prepared) == [ldmerge.FOLDER_CACHE]  # kept for the next container


def test_both_implementations_merge_a_prepared_folder_into_the_same_bytes(
    fake: Fake, tmp_path: Path
) -> None:
    prepared = tmp_path / "prepared"
    prepared.mkdir()
    (prepared / ldmerge.FOLDER_CACHE).write_bytes(ldcache.serialize(FOLDER_CACHE))
    written = []
    for n, impl in enumerate(([str(RUNTIME)], [sys.executable, "-I", "-S", str(CLI_ENTRY)])):
        rootfs = _rootfs(tmp_path / str(n))
        (rootfs / "etc/ld.so.cache").write_bytes(ldcache.serialize(IMAGE))
        args = ["--ldconfig", str(fake.path), "--rootfs", str(rootfs), "--folder", FOLDER]
        result = _run(impl, *args, "--cache", f"{FOLDER}={prepared}")
        assert (result.returncode, result.stderr) == (0, "")
        written.append((rootfs / "etc/ld.so.cache").read_bytes())
    assert written[0] == written[1]
    assert fake.runs() == []


@IMPLS
def test_a_prepared_folder_whose_entries_are_gone_gets_the_full_run(
    impl: list[str], fake: Fake, tmp_path: Path
) -> None:
    rootfs = _rootfs(tmp_path)
    args = ["--ldconfig", str(fake.path), "--rootfs", str(rootfs), "--folder", FOLDER]
    result = _run(impl, *args, "--cache", f"{FOLDER}={tmp_path / 'gone'}")
    assert (result.returncode, result.stderr) == (0, "")
    assert [r["argv"][:2] for r in fake.runs()] == [FULL]


@IMPLS
def test_an_image_without_a_cache_gets_the_injected_entries_only(
    impl: list[str], fake: Fake, tmp_path: Path
) -> None:
    """Every other library still resolves through the loader's default folders, as before."""
    rootfs = _rootfs(tmp_path)
    (rootfs / "etc").rmdir()  # a scratch-like image: /etc is made
    fake.folder_cache.write_bytes(ldcache.serialize(FOLDER_CACHE[:2]))
    result = _run(impl, "--ldconfig", str(fake.path), "--rootfs", str(rootfs), "--folder", FOLDER)
    assert (result.returncode, result.stderr) == (0, "")
    assert _cache(rootfs) == [
        ("libnvidia-ml.so.1", f"{FOLDER}/libnvidia-ml.so.1", X86_64),
        ("libnvidia-ml.so", f"{FOLDER}/libnvidia-ml.so", X86_64),
    ]
    assert len(fake.runs()) == 1


def _unmergeable(rootfs: Path, case: str) -> None:
    cache = rootfs / "etc/ld.so.cache"
    good = ldcache.serialize(IMAGE)
    if case == "link":
        cache.symlink_to("/etc/ld.so.cache")  # the host's: never read
    elif case == "fifo":
        os.mkfifo(cache)
    elif case == "folder":
        cache.mkdir()
    elif case == "etc-link":
        (rootfs / "etc").rmdir()
        (rootfs / "etc").symlink_to("/etc")
    elif case == "garbage":
        cache.write_bytes(b"not a cache at all")
    elif case == "old-format":
        cache.write_bytes(ldcache.OLD_MAGIC + b"\0" + bytes(4))
    elif case == "other-byte-order":
        cache.write_bytes(good[:28] + b"\x03" + good[29:])
    elif case == "unsorted":
        cache.write_bytes(ldcache.serialize(list(reversed(IMAGE))))
    elif case == "glibc-hwcaps":
        cache.write_bytes(ldcache.serialize([CacheEntry("libz.so.1", "/x", X86_64, None, 1 << 62)]))
    elif case == "non-ascii-key":
        cache.write_bytes(ldcache.serialize([_entry("libé.so.1", "/x")]))
    elif case == "long-digit-run":
        cache.write_bytes(ldcache.serialize([_entry("libz.so.1234567890", "/x")]))
    elif case == "truncated":
        cache.write_bytes(good[:-10])


UNMERGEABLE = [
    "link",
    "fifo",
    "folder",
    "etc-link",
    "garbage",
    "old-format",
    "other-byte-order",
    "unsorted",
    "glibc-hwcaps",
    "non-ascii-key",
    "long-digit-run",
    "truncated",
]


@IMPLS
@pytest.mark.parametrize("case", UNMERGEABLE)
def test_an_image_cache_that_cannot_be_merged_exactly_gets_the_full_run(
    impl: list[str], case: str, fake: Fake, tmp_path: Path
) -> None:
    """Never read through a link, never a FIFO; anything the merge cannot keep exactly as the
    loader reads it: ldconfig -r rebuilds the cache, chrooted, as gpuhook always did."""
    rootfs = _rootfs(tmp_path)
    _unmergeable(rootfs, case)
    fake.folder_cache.write_bytes(ldcache.serialize(FOLDER_CACHE))
    result = _run(impl, "--ldconfig", str(fake.path), "--rootfs", str(rootfs), "--folder", FOLDER)
    assert (result.returncode, result.stderr) == (0, "")
    assert [(r["argv"], r["cwd"], r["limits"]) for r in fake.runs()] == [
        ([*FULL, str(rootfs), FOLDER], "/", BOUNDS)
    ]


@IMPLS
@pytest.mark.parametrize("case", ["no-output", "relative-value", "hwcaps-entry"])
def test_a_folder_run_that_cannot_be_merged_gets_the_full_run(
    impl: list[str], case: str, fake: Fake, tmp_path: Path
) -> None:
    rootfs = _rootfs(tmp_path)
    if case == "relative-value":
        fake.folder_cache.write_bytes(ldcache.serialize([_entry("libcuda.so.1", "libcuda.so.1")]))
    elif case == "hwcaps-entry":
        entry = CacheEntry("libcuda.so.1", "/./libcuda.so.1", X86_64, None, 1 << 62)
        fake.folder_cache.write_bytes(ldcache.serialize([entry]))
    result = _run(impl, "--ldconfig", str(fake.path), "--rootfs", str(rootfs), "--folder", FOLDER)
    assert (result.returncode, result.stderr) == (0, "")
    assert [r["argv"] for r in fake.runs()] == [FOLDER_RUN, [*FULL, str(rootfs), FOLDER]]
    assert os.listdir(rootfs / FOLDER.lstrip("/")) == []


@IMPLS
def test_a_folder_behind_a_link_of_the_image_gets_the_full_run(
    impl: list[str], fake: Fake, tmp_path: Path
) -> None:
    """The injected folder is reached only without links (runc mounted it inside the rootfs,
    wherever the image's link led: ldconfig -r resolves it there); a missing one is skipped."""
    rootfs = _rootfs(tmp_path, "/real")
    (rootfs / "opt").symlink_to("real")
    fake.folder_cache.write_bytes(ldcache.serialize(FOLDER_CACHE))
    args = ["--ldconfig", str(fake.path), "--rootfs", str(rootfs)]
    result = _run(impl, *args, "--folder", "/missing", "--folder", "/opt")
    assert (result.returncode, result.stderr) == (0, "")
    assert [r["argv"] for r in fake.runs()] == [[*FULL, str(rootfs), "/missing", "/opt"]]


# --- bounds and failures --------------------------------------------------------------------------


@IMPLS
def test_a_failing_ldconfig_warns_and_lets_the_container_start(
    impl: list[str], fake: Fake, tmp_path: Path
) -> None:
    rootfs = _rootfs(tmp_path)
    fake.rc.write_text("3")
    result = _run(impl, "--ldconfig", str(fake.path), "--rootfs", str(rootfs), "--folder", FOLDER)
    assert result.returncode == 0
    assert result.stderr == (
        f"gpuhook hook update-ldcache: {fake.path} exited with 3; "
        "the container's ld.so.cache was not refreshed\n"
    )
    # the folder's run failed, so did the full one; Python reported it, did not run it again
    assert [r["argv"] for r in fake.runs()] == [FOLDER_RUN, [*FULL, str(rootfs), FOLDER]]


@IMPLS
def test_ldconfig_is_killed_past_its_wall_time(
    impl: list[str], fake: Fake, tmp_path: Path
) -> None:
    """An image whose ld.so.conf is a FIFO blocks ldconfig forever: the hook kills it at the
    bound (every run together), warns, and lets the container start."""
    rootfs = _rootfs(tmp_path)
    fake.sleep.write_text("30")
    started = time.monotonic()
    args = ["--ldconfig", str(fake.path), "--rootfs", str(rootfs), "--folder", FOLDER]
    result = _run(impl, *args, "--timeout", "1")
    assert time.monotonic() - started < 10
    assert result.returncode == 0
    assert result.stderr == (
        f"gpuhook hook update-ldcache: {fake.path} ran past 1s; "
        "the container's ld.so.cache was not refreshed\n"
    )


def test_a_failed_run_is_logged_once_by_python(fake: Fake, tmp_path: Path) -> None:
    """The static dispatcher hands a failed ldconfig to Python, which logs it as
    gpuhook.runtime.hooks logs it: one warning event in the config's log file, bound to the
    container of the OCI state (which the dispatcher left unread on stdin)."""
    from tests.logcapture import log_lines

    rootfs = _rootfs(tmp_path)
    fake.rc.write_text("3")
    args = ["--ldconfig", str(fake.path), "--rootfs", str(rootfs), "--folder", FOLDER]
    result = _run([str(RUNTIME)], *args)
    assert result.returncode == 0
    [event] = log_lines(tmp_path / "node" / "log" / "gpuhook.log")
    assert (event["event"], event["level"], event["container_id"], event["exit_code"]) == (
        "ldcache not refreshed",
        "warning",
        "c-hook",
        3,
    )
    assert event["command"] == [str(fake.path), *FULL, str(rootfs), FOLDER]
    assert len(fake.runs()) == 2


@IMPLS
def test_a_missing_rootfs_fails_the_hook(impl: list[str], fake: Fake, tmp_path: Path) -> None:
    missing = tmp_path / "nope"
    result = _run(impl, "--ldconfig", str(fake.path), "--rootfs", str(missing))
    assert result.returncode == 1
    assert result.stderr == (
        f"gpuhook hook update-ldcache: container rootfs {missing} is not a directory\n"
    )
    assert fake.runs() == []


@IMPLS
def test_a_non_executable_ldconfig_fails_the_hook(impl: list[str], tmp_path: Path) -> None:
    rootfs = _rootfs(tmp_path)
    result = _run(impl, "--ldconfig", str(tmp_path / "none"), "--rootfs", str(rootfs))
    assert result.returncode == 2
    assert result.stderr.startswith("gpuhook hook update-ldcache: ")
    assert f"ldconfig {tmp_path / 'none'} is not executable" in result.stderr


@IMPLS
@pytest.mark.parametrize(
    "bad",
    [
        ["--folder", "relative/lib"],
        ["--folder", "/usr/../etc"],
        ["--rootfs", "relative"],
        ["--unknown", "x"],
        ["--timeout", "0"],
        ["--timeout", "3601"],
        ["--folder"],
        ["--cache", "/usr/local/gpuhook/lib"],
        ["--cache", "relative=/x"],
        ["--cache", "/usr/local/gpuhook/lib=relative"],
        ["--cache", "/usr/local/gpuhook/lib=/x/../y"],
    ],
)
def test_malformed_arguments_are_refused(
    impl: list[str], bad: list[str], fake: Fake, tmp_path: Path
) -> None:
    """Anything but the exact form gpuhook-runtime writes is not run by C: Python refuses it."""
    rootfs = _rootfs(tmp_path)
    result = _run(impl, "--ldconfig", str(fake.path), "--rootfs", str(rootfs), *bad)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("gpuhook hook update-ldcache: ")
    assert fake.runs() == []


@IMPLS
def test_the_legacy_form_finds_the_rootfs_through_the_oci_state(
    impl: list[str], fake: Fake, tmp_path: Path
) -> None:
    """A spec written before --rootfs existed still works (the dispatcher hands it to Python)."""
    bundle = tmp_path / "bundle"
    rootfs = _rootfs(bundle)
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "bundle": str(bundle)})
    result = _run(impl, "--ldconfig", str(fake.path), "--folder", FOLDER, stdin=state)
    assert (result.returncode, result.stderr) == (0, "")
    assert [r["argv"] for r in fake.runs()] == [FOLDER_RUN, [*FULL, str(rootfs), FOLDER]]


# --- the spec's hook ------------------------------------------------------------------------------


def test_the_shim_writes_the_rootfs_form_run_by_the_static_dispatcher() -> None:
    """The hook gpuhook-runtime writes names the rootfs it resolved at create time, and the
    static gpuhook-runtime beside hook.path's gpuhook as its program."""
    out = decide.run(
        f.spec(env=["NVIDIA_VISIBLE_DEVICES=1"]),
        f.config(hook__path="/opt/gpuhook/bin/gpuhook"),
        inventory_source=lambda _c: f.inventory(8),
        rootfs="/run/bundles/c1/rootfs",
    )
    hook = out.spec["hooks"]["createContainer"][0]
    assert hook["path"] == "/opt/gpuhook/bin/gpuhook-runtime"
    assert hook["args"] == [
        "gpuhook-runtime",
        "hook",
        "update-ldcache",
        "--ldconfig",
        "/sbin/ldconfig",
        "--rootfs",
        "/run/bundles/c1/rootfs",
        "--folder",
        FOLDER,
        "--link",
        f"{FOLDER}/libcuda.so=libcuda.so.1",
        "--link",
        f"{FOLDER}/libnvidia-ml.so=libnvidia-ml.so.1",
    ]
    assert decide.rootfs_of("/run/bundles/c1", {"root": {"path": "rootfs"}}) == (
        "/run/bundles/c1/rootfs"
    )
    assert decide.rootfs_of("/b", {"root": {"path": "/abs/root"}}) == "/abs/root"
    assert decide.rootfs_of("/b", {}) == ""


@pytest.mark.parametrize(
    ("hook_path", "level", "program", "with_rootfs"),
    [
        ("/usr/bin/gpuhook", "debug", "/usr/bin/gpuhook", False),  # Python logs every refresh
        ("/usr/local/sbin/my-hook", "info", "/usr/local/sbin/my-hook", True),  # not gpuhook's
    ],
    ids=["debug-level", "another-program"],
)
def test_the_python_form_where_the_static_dispatcher_does_not_run_it(
    hook_path: str, level: str, program: str, with_rootfs: bool
) -> None:
    out = decide.run(
        f.spec(env=["NVIDIA_VISIBLE_DEVICES=1"]),
        f.config(log__level=level, hook__path=hook_path),
        inventory_source=lambda _c: f.inventory(8),
        rootfs="/run/bundles/c1/rootfs",
    )
    hook = out.spec["hooks"]["createContainer"][0]
    assert (hook["path"], hook["args"][:3]) == (
        program,
        [os.path.basename(program), "hook", "update-ldcache"],
    )
    assert ("--rootfs" in hook["args"]) == with_rootfs


def test_the_runtime_hands_any_other_hook_call_to_python(tmp_path: Path) -> None:
    out = subprocess.run(
        [str(RUNTIME), "hook", "no-such-verb"], capture_output=True, text=True, check=False
    )
    assert out.returncode == 2
    assert out.stderr == "gpuhook hook: unknown verb; known: update-ldcache\n"


# --- the driver's links ---------------------------------------------------------------------------


def _links_rootfs(tmp_path: Path) -> Path:
    rootfs = _rootfs(tmp_path)
    (rootfs / FOLDER.lstrip("/") / "gbm").mkdir(parents=True)
    return rootfs


LINKS = [
    "--link",
    f"{FOLDER}/libcuda.so=libcuda.so.1",
    "--link",
    f"{FOLDER}/gbm/nvidia-drm_gbm.so=../libnvidia-allocator.so.1",
]


@IMPLS
def test_links_are_made_in_the_rootfs_before_ldconfig(
    impl: list[str], fake: Fake, tmp_path: Path
) -> None:
    rootfs = _links_rootfs(tmp_path)
    (rootfs / "etc").rmdir()
    args = ["--ldconfig", str(fake.path), "--rootfs", str(rootfs), "--folder", FOLDER]
    for _ in range(2):  # a second run finds the links made and leaves them
        result = _run(impl, *args, *LINKS)
        assert (result.returncode, result.stderr) == (0, "")
        lib = rootfs / FOLDER.lstrip("/")
        assert os.readlink(lib / "libcuda.so") == "libcuda.so.1"
        assert os.readlink(lib / "gbm" / "nvidia-drm_gbm.so") == "../libnvidia-allocator.so.1"
    assert (rootfs / "etc").is_dir()  # made, so that the cache can be written


@IMPLS
def test_a_link_folder_behind_an_image_link_is_resolved_inside_the_rootfs(
    impl: list[str], fake: Fake, tmp_path: Path
) -> None:
    """The image's /usr/local is an absolute link to a host folder that has gpuhook/lib: the
    link is made in the rootfs's own copy of that path (as runc mounted the tmpfs there), never
    on the host."""
    host = tmp_path / "host"
    (host / "gpuhook" / "lib").mkdir(parents=True)
    rootfs = tmp_path / "rootfs"
    inside = rootfs / str(host).lstrip("/") / "gpuhook" / "lib"
    inside.mkdir(parents=True)
    (rootfs / "usr").mkdir()
    (rootfs / "usr" / "local").symlink_to(host)
    result = _run(impl, "--ldconfig", str(fake.path), "--rootfs", str(rootfs), *LINKS[:2])
    assert (result.returncode, result.stderr) == (0, "")
    assert list((host / "gpuhook" / "lib").iterdir()) == []
    assert os.readlink(inside / "libcuda.so") == "libcuda.so.1"


@IMPLS
def test_an_existing_file_is_not_replaced_by_a_link(
    impl: list[str], fake: Fake, tmp_path: Path
) -> None:
    rootfs = _links_rootfs(tmp_path)
    taken = rootfs / FOLDER.lstrip("/") / "libcuda.so"
    taken.write_text("the image's own\n")
    fake.folder_cache.write_bytes(ldcache.serialize(FOLDER_CACHE))
    args = ["--ldconfig", str(fake.path), "--rootfs", str(rootfs), "--folder", FOLDER]
    result = _run(impl, *args, *LINKS)
    assert result.returncode == 0
    assert result.stderr == (
        f"gpuhook hook update-ldcache: link {FOLDER}/libcuda.so: exists and is not a link "
        "not made\n"
    )
    assert taken.read_text() == "the image's own\n"
    assert [r["argv"] for r in fake.runs()] == [FOLDER_RUN]  # the cache was still updated


@IMPLS
@pytest.mark.parametrize(
    "bad", ["lib/libcuda.so=libcuda.so.1", "/a/../b=x", "/a/b=/etc/passwd", "/a/b", "/a/b="]
)
def test_malformed_links_are_refused(
    impl: list[str], bad: str, fake: Fake, tmp_path: Path
) -> None:
    rootfs = _links_rootfs(tmp_path)
    result = _run(impl, "--ldconfig", str(fake.path), "--rootfs", str(rootfs), "--link", bad)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"gpuhook hook update-ldcache: invalid --link {bad!r} (LINK=TARGET)\n"
    assert fake.runs() == []


@IMPLS
@pytest.mark.parametrize(
    ("compat", "first"),
    [("550.54.15:14", True), ("550.54.15:5", False), ("580.65.06:14", False)],
    ids=["older-host", "geforce", "newer-host"],
)
def test_the_cdi_form_decides_forward_compatibility_in_the_hook(
    impl: list[str], compat: str, first: bool, fake: Fake, tmp_path: Path
) -> None:
    from tests import driverimages

    rootfs = _links_rootfs(tmp_path)
    driverimages.install_compat(rootfs, "570.124.06", None)
    args = ["--ldconfig", str(fake.path), "--rootfs", str(rootfs), "--folder", FOLDER]
    result = _run(impl, *args, "--cuda-compat", compat)
    assert (result.returncode, result.stderr) == (0, "")
    # no folder cache: the full run shows the folders in their order
    folders = fake.runs()[-1]["argv"][3:]
    assert folders == (["/usr/local/cuda-12.8/compat", FOLDER] if first else [FOLDER])


def test_the_static_dispatcher_runs_the_hook_without_python(
    fake: Fake, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python, at debug level, would log "ldcache refreshed": the dispatcher's run logs nothing;
    a link folder behind an image link is handed to Python (which logs)."""
    from tests.logcapture import log_lines, paper_node

    config = paper_node(tmp_path / "debug", log={"level": "debug", "file": str(tmp_path / "log")})
    monkeypatch.setitem(HOOK_ENV, "GPUHOOK_CONFIG", str(config))
    rootfs = _links_rootfs(tmp_path)
    fake.folder_cache.write_bytes(ldcache.serialize(FOLDER_CACHE))
    args = ["--ldconfig", str(fake.path), "--rootfs", str(rootfs), "--folder", FOLDER]
    result = _run([str(RUNTIME)], *args, *LINKS)
    assert (result.returncode, result.stderr) == (0, "")
    assert os.readlink(rootfs / FOLDER.lstrip("/") / "libcuda.so") == "libcuda.so.1"
    assert not (tmp_path / "log").exists()
    (rootfs / "usr" / "local" / "gpuhook").rename(rootfs / "real")
    (rootfs / "usr" / "local" / "gpuhook").symlink_to("/real")
    (rootfs / "real" / "lib" / "libcuda.so").unlink()
    result = _run([str(RUNTIME)], *args, *LINKS)
    assert (result.returncode, result.stderr) == (0, "")
    assert os.readlink(rootfs / "real" / "lib" / "libcuda.so") == "libcuda.so.1"
    assert [e["event"] for e in log_lines(tmp_path / "log")] == [
        "ldcache: the full ldconfig run",  # the folder is behind the image's link now
        "ldcache refreshed",
    ]
