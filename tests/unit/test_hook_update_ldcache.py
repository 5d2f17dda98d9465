"""`gpuhook hook update-ldcache`, as runc runs it: through the installed sh dispatcher (which runs
the --rootfs form itself, without Python) and through the Python implementation. Both must start
the same ldconfig command line, with the same explicit environment, from /, and report the same
outcomes. A fake ldconfig (a sh script) records what it was started with."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from gpuhook.runtime import decide
from tests import factories as f

REPO = Path(__file__).resolve().parents[2]
DISPATCHER = REPO / "build" / "bin" / "gpuhook"
CLI_ENTRY = REPO / "src" / "gpuhook" / "_cli_entry.py"
FOLDER = "/usr/local/gpuhook/lib"

# How runc starts the hook: the spec's explicit env, plus whatever a hostile spec could add.
HOOK_ENV = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LD_LIBRARY_PATH": "/nonexistent", "FOO": "1"}


@pytest.fixture(autouse=True)
def _own_config(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A config whose log file is the test's (the default one logs to /var/log/gpuhook)."""
    from tests.logcapture import paper_node

    monkeypatch.setitem(HOOK_ENV, "GPUHOOK_CONFIG", str(paper_node(tmp_path / "node")))
    # as gpuhook-runtime passes its cache folder on (Config.propagated_env): the session's
    monkeypatch.setitem(HOOK_ENV, "GPUHOOK_CACHE_DIR", os.environ["GPUHOOK_CACHE_DIR"])


def _impls() -> list[list[str]]:
    return [[str(DISPATCHER)], [sys.executable, "-I", "-S", str(CLI_ENTRY)]]


IMPLS = pytest.mark.parametrize("impl", _impls(), ids=["sh-dispatcher", "python"])


@pytest.fixture
def fake_ldconfig(tmp_path: Path) -> Path:
    """Records argv, its initial environment (/proc/self/environ: exactly what exec passed),
    cwd and rlimits; exits with $FAKE_RC (from a file) and sleeps $FAKE_SLEEP."""
    out = tmp_path / "record"
    script = tmp_path / "ldconfig"
    script.write_text(
        "#!/bin/sh\n"
        f"exec 3>{out}\n"
        f"echo run >> {tmp_path}/runs\n"
        'printf "%s\\n" "$@" >&3\n'
        "echo --- >&3\n"
        "tr '\\0' '\\n' < /proc/$$/environ >&3\n"
        "echo --- >&3\n"
        "pwd >&3\n"
        "ulimit -d >&3; ulimit -t >&3\n"
        f"[ -f {tmp_path}/sleep ] && sleep $(cat {tmp_path}/sleep)\n"
        f"exit $(cat {tmp_path}/rc 2>/dev/null || echo 0)\n"
    )
    script.chmod(0o755)
    return script


def _record(ldconfig: Path) -> dict[str, Any]:
    text = (ldconfig.parent / "record").read_text()
    argv, env, rest = text.split("---\n")
    cwd, data, cpu = rest.split()
    environ = dict(line.split("=", 1) for line in env.splitlines() if line)
    environ.pop("PWD", None)  # the fake ldconfig is a sh script: dash sets PWD itself
    return {"argv": argv.splitlines(), "env": environ, "cwd": cwd, "data": data, "cpu": cpu}


def _run(
    impl: list[str], *args: str, stdin: str = "", timeout: float = 30
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


@IMPLS
def test_rootfs_form_runs_ldconfig_chrooted_with_explicit_env(
    impl: list[str], fake_ldconfig: Path, tmp_path: Path
) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    result = _run(
        impl,
        "--ldconfig",
        str(fake_ldconfig),
        "--rootfs",
        str(rootfs),
        "--folder",
        FOLDER,
        "--folder",
        FOLDER + "32",
        stdin='{"ociVersion":"1.0.2","id":"x","status":"creating","bundle":"/nonexistent"}',
    )
    assert (result.returncode, result.stderr) == (0, "")
    seen = _record(fake_ldconfig)
    assert seen["argv"] == ["-X", "-r", str(rootfs), FOLDER, FOLDER + "32"]
    assert seen["env"] == {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C"}
    assert seen["cwd"] == "/"


def test_sh_dispatcher_bounds_ldconfig(fake_ldconfig: Path, tmp_path: Path) -> None:
    """The bounds of gpuhook.runtime.hooks (heap, CPU time) hold for the sh implementation too."""
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    result = _run([str(DISPATCHER)], "--ldconfig", str(fake_ldconfig), "--rootfs", str(rootfs))
    assert result.returncode == 0, result.stderr
    seen = _record(fake_ldconfig)
    assert (seen["data"], seen["cpu"]) == ("262144", "10")


def test_sh_dispatcher_kills_ldconfig_past_its_wall_time(
    fake_ldconfig: Path, tmp_path: Path
) -> None:
    """An image whose ld.so.conf is a FIFO blocks ldconfig forever: the hook kills it at the
    bound, warns, and lets the container start."""
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    (tmp_path / "sleep").write_text("30")
    started = time.monotonic()
    result = _run(
        [str(DISPATCHER)],
        "--ldconfig",
        str(fake_ldconfig),
        "--rootfs",
        str(rootfs),
        "--timeout",
        "1",
    )
    assert time.monotonic() - started < 10
    assert result.returncode == 0
    assert result.stderr == (
        f"gpuhook hook update-ldcache: {fake_ldconfig} ran past 1s; "
        "the container's ld.so.cache was not refreshed\n"
    )


@IMPLS
def test_failing_ldconfig_warns_and_lets_the_container_start(
    impl: list[str], fake_ldconfig: Path, tmp_path: Path
) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    (tmp_path / "rc").write_text("3")
    result = _run(impl, "--ldconfig", str(fake_ldconfig), "--rootfs", str(rootfs))
    assert result.returncode == 0
    assert result.stderr == (
        f"gpuhook hook update-ldcache: {fake_ldconfig} exited with 3; "
        "the container's ld.so.cache was not refreshed\n"
    )


@IMPLS
def test_missing_rootfs_fails_the_hook(
    impl: list[str], fake_ldconfig: Path, tmp_path: Path
) -> None:
    missing = tmp_path / "nope"
    result = _run(impl, "--ldconfig", str(fake_ldconfig), "--rootfs", str(missing))
    assert result.returncode == 1
    assert result.stderr == (
        f"gpuhook hook update-ldcache: container rootfs {missing} is not a directory\n"
    )
    assert not (tmp_path / "record").exists()


@IMPLS
def test_non_executable_ldconfig_fails_the_hook(impl: list[str], tmp_path: Path) -> None:
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
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
    ],
)
def test_malformed_arguments_are_refused(
    impl: list[str], bad: list[str], fake_ldconfig: Path, tmp_path: Path
) -> None:
    """Anything but the exact form gpuhook-runtime writes is not run by sh: Python refuses it."""
    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    args = ["--ldconfig", str(fake_ldconfig), "--rootfs", str(rootfs), *bad]
    result = _run(impl, *args)
    assert result.returncode == 2, result.stderr
    assert result.stderr.startswith("gpuhook hook update-ldcache: ")
    assert not (tmp_path / "record").exists()


@IMPLS
def test_legacy_form_finds_the_rootfs_through_the_oci_state(
    impl: list[str], fake_ldconfig: Path, tmp_path: Path
) -> None:
    """A spec written before --rootfs existed still works (the dispatcher hands it to Python)."""
    bundle = tmp_path / "bundle"
    (bundle / "rootfs").mkdir(parents=True)
    (bundle / "config.json").write_text(json.dumps({"root": {"path": "rootfs"}}))
    state = json.dumps({"ociVersion": "1.0.2", "id": "c1", "bundle": str(bundle)})
    result = _run(impl, "--ldconfig", str(fake_ldconfig), "--folder", FOLDER, stdin=state)
    assert (result.returncode, result.stderr) == (0, "")
    assert _record(fake_ldconfig)["argv"] == ["-X", "-r", str(bundle / "rootfs"), FOLDER]


def test_shim_writes_the_rootfs_form() -> None:
    """The hook gpuhook-runtime writes names the rootfs it resolved at create time."""
    out = decide.run(
        f.spec(env=["NVIDIA_VISIBLE_DEVICES=1"]),
        f.config(),
        inventory_source=lambda _c: f.inventory(8),
        rootfs="/run/bundles/c1/rootfs",
    )
    hook = out.spec["hooks"]["createContainer"][0]
    assert hook["args"][1:] == [
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


def test_dispatcher_is_posix_sh() -> None:
    """The dispatcher parses with dash (Debian's /bin/sh) and with bash in POSIX mode."""
    for shell in (["/bin/sh", "-n"], ["bash", "--posix", "-n"]):
        assert subprocess.run([*shell, str(DISPATCHER)], check=False).returncode == 0
    assert os.access(DISPATCHER, os.X_OK)


def test_sh_dispatcher_hands_a_failed_run_to_python_which_logs_it(
    fake_ldconfig: Path, tmp_path: Path
) -> None:
    """A failing ldconfig run by the dispatcher is logged as gpuhook.runtime.hooks logs it: one
    warning
    event in the config's log file, bound to the container of the OCI state; ldconfig ran once."""
    from tests.logcapture import log_lines

    rootfs = tmp_path / "rootfs"
    rootfs.mkdir()
    (tmp_path / "rc").write_text("3")
    state = json.dumps({"ociVersion": "1.0.2", "id": "c-fail", "bundle": "/nonexistent"})
    result = subprocess.run(
        [
            *(str(DISPATCHER), "hook", "update-ldcache", "--ldconfig", str(fake_ldconfig)),
            *("--rootfs", str(rootfs), "--folder", FOLDER),
        ],
        input=state,
        capture_output=True,
        text=True,
        env=HOOK_ENV,
        cwd="/tmp",
        timeout=30,
        check=False,
    )
    assert result.returncode == 0
    assert result.stderr == (
        f"gpuhook hook update-ldcache: {fake_ldconfig} exited with 3; "
        "the container's ld.so.cache was not refreshed\n"
    )
    [event] = log_lines(tmp_path / "node" / "log" / "gpuhook.log")
    assert (event["event"], event["level"], event["container_id"], event["exit_code"]) == (
        "ldcache not refreshed",
        "warning",
        "c-fail",
        3,
    )
    assert event["command"] == [str(fake_ldconfig), "-X", "-r", str(rootfs), FOLDER]
    assert (tmp_path / "runs").read_text() == "run\n"  # Python reported it, did not run it again


def test_at_debug_level_the_hook_runs_in_python_which_logs_every_refresh() -> None:
    """Without --rootfs the dispatcher hands the hook to Python (which logs "ldcache refreshed")."""
    out = decide.run(
        f.spec(env=["NVIDIA_VISIBLE_DEVICES=1"]),
        f.config(log__level="debug"),
        inventory_source=lambda _c: f.inventory(8),
        rootfs="/run/bundles/c1/rootfs",
    )
    args = out.spec["hooks"]["createContainer"][0]["args"]
    assert "--rootfs" not in args
    assert args[5:7] == ["--folder", FOLDER]


def _links_rootfs(tmp_path: Path) -> Path:
    rootfs = tmp_path / "rootfs"
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
    impl: list[str], fake_ldconfig: Path, tmp_path: Path
) -> None:
    rootfs = _links_rootfs(tmp_path)
    args = ["--ldconfig", str(fake_ldconfig), "--rootfs", str(rootfs), "--folder", FOLDER]
    for _ in range(2):  # a second run finds the links made and leaves them
        result = _run(impl, *args, *LINKS)
        assert (result.returncode, result.stderr) == (0, "")
        lib = rootfs / FOLDER.lstrip("/")
        assert os.readlink(lib / "libcuda.so") == "libcuda.so.1"
        assert os.readlink(lib / "gbm" / "nvidia-drm_gbm.so") == "../libnvidia-allocator.so.1"
    assert _record(fake_ldconfig)["argv"] == ["-X", "-r", str(rootfs), FOLDER]
    assert (rootfs / "etc").is_dir()  # made, so that ldconfig can write the cache


@IMPLS
def test_a_link_folder_behind_an_image_link_is_resolved_inside_the_rootfs(
    impl: list[str], fake_ldconfig: Path, tmp_path: Path
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
    result = _run(impl, "--ldconfig", str(fake_ldconfig), "--rootfs", str(rootfs), *LINKS[:2])
    assert (result.returncode, result.stderr) == (0, "")
    assert list((host / "gpuhook" / "lib").iterdir()) == []
    assert os.readlink(inside / "libcuda.so") == "libcuda.so.1"


@IMPLS
def test_an_existing_file_is_not_replaced_by_a_link(
    impl: list[str], fake_ldconfig: Path, tmp_path: Path
) -> None:
    rootfs = _links_rootfs(tmp_path)
    taken = rootfs / FOLDER.lstrip("/") / "libcuda.so"
    taken.write_text("the image's own\n")
    result = _run(impl, "--ldconfig", str(fake_ldconfig), "--rootfs", str(rootfs), *LINKS)
    assert result.returncode == 0
    assert result.stderr == (
        f"gpuhook hook update-ldcache: link {FOLDER}/libcuda.so: exists and is not a link "
        "not made\n"
    )
    assert taken.read_text() == "the image's own\n"
    assert (tmp_path / "record").exists()  # ldconfig still ran


@IMPLS
@pytest.mark.parametrize(
    "bad", ["lib/libcuda.so=libcuda.so.1", "/a/../b=x", "/a/b=/etc/passwd", "/a/b", "/a/b="]
)
def test_malformed_links_are_refused(
    impl: list[str], bad: str, fake_ldconfig: Path, tmp_path: Path
) -> None:
    rootfs = _links_rootfs(tmp_path)
    result = _run(impl, "--ldconfig", str(fake_ldconfig), "--rootfs", str(rootfs), "--link", bad)
    assert result.returncode == 2, result.stderr
    assert result.stderr == f"gpuhook hook update-ldcache: invalid --link {bad!r} (LINK=TARGET)\n"
    assert not (tmp_path / "record").exists()


@IMPLS
@pytest.mark.parametrize(
    ("compat", "first"),
    [("550.54.15:14", True), ("550.54.15:5", False), ("580.65.06:14", False)],
    ids=["older-host", "geforce", "newer-host"],
)
def test_the_cdi_form_decides_forward_compatibility_in_the_hook(
    impl: list[str], compat: str, first: bool, fake_ldconfig: Path, tmp_path: Path
) -> None:
    from tests import driverimages

    rootfs = _links_rootfs(tmp_path)
    driverimages.install_compat(rootfs, "570.124.06", None)
    args = ["--ldconfig", str(fake_ldconfig), "--rootfs", str(rootfs), "--folder", FOLDER]
    result = _run(impl, *args, "--cuda-compat", compat)
    assert (result.returncode, result.stderr) == (0, "")
    folders = _record(fake_ldconfig)["argv"][3:]
    assert folders == (["/usr/local/cuda-12.8/compat", FOLDER] if first else [FOLDER])


def test_sh_dispatcher_makes_the_links_without_python(
    fake_ldconfig: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Python, at debug level, would log "ldcache refreshed": the dispatcher's run logs nothing;
    a link folder behind an image link is handed to Python (which logs)."""
    from tests.logcapture import log_lines, paper_node

    config = paper_node(tmp_path / "debug", log={"level": "debug", "file": str(tmp_path / "log")})
    monkeypatch.setitem(HOOK_ENV, "GPUHOOK_CONFIG", str(config))
    rootfs = _links_rootfs(tmp_path)
    result = _run(
        [str(DISPATCHER)], "--ldconfig", str(fake_ldconfig), "--rootfs", str(rootfs), *LINKS
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert os.readlink(rootfs / FOLDER.lstrip("/") / "libcuda.so") == "libcuda.so.1"
    assert not (tmp_path / "log").exists()
    (rootfs / "usr" / "local" / "gpuhook").rename(rootfs / "real")
    (rootfs / "usr" / "local" / "gpuhook").symlink_to("/real")
    (rootfs / "real" / "lib" / "libcuda.so").unlink()
    result = _run(
        [str(DISPATCHER)], "--ldconfig", str(fake_ldconfig), "--rootfs", str(rootfs), *LINKS
    )
    assert (result.returncode, result.stderr) == (0, "")
    assert os.readlink(rootfs / "real" / "lib" / "libcuda.so") == "libcuda.so.1"
    assert [e["event"] for e in log_lines(tmp_path / "log")] == ["ldcache refreshed"]
