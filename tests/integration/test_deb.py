"""The Debian package, end to end.

* ``make deb`` in a clean copy of this checkout (no .venv, no build/) gives dist/gpuhook_*.deb
  and dist/python3-nvidia-ml-py_*.deb (from the PyPI sdist whose sha256 is pinned; another file
  is refused) that lintian passes with no error and no warning beyond the ones docs/install.md
  explains.
* In a fresh Debian 12 root made with debootstrap, ``apt-get install ./dist/*.deb`` pulls the
  dependencies, the installed executables work and ``gpuhook inventory refresh`` reads the fake
  node through the packaged pynvml; ``dpkg -r`` keeps only the conffiles and state, ``dpkg -P``
  leaves no file behind; a second install on a node with an NVIDIA driver (the fake NVML
  library) refreshes the inventory in postinst; purging the bindings leaves none of their files.
* On this host: ``dpkg -i`` of both, real runc containers through /usr/bin/gpuhook-runtime on
  the fake node, the integration suites again with GPUHOOK_TEST_EXECUTABLES=/usr/bin, then
  ``dpkg -P`` and the host is as it was. (Timings of the installed package are ``make bench``'s:
  ``bench/lifecycle.py --runtime /usr/bin/gpuhook-runtime --hook /usr/bin/gpuhook``.)

The debootstrap root is cached as a tarball in build/debian-bookworm/ (with the downloaded
packages), so a second run skips debootstrap; from nothing it needs network access to
deb.debian.org (and ``make deb`` to PyPI, for the sdist).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest
import testbed

from gpuhook.errors import NodeInstallError
from gpuhook.inventory import nvml
from gpuhook.node import bundle
from gpuhook.runtime import dispatch
from tests.conftest import Containers, make_fake_node

pytestmark = [pytest.mark.slow, pytest.mark.root]

REPO = Path(__file__).resolve().parents[2]
CACHE = REPO / "build" / "debian-bookworm"
MIRROR = "http://deb.debian.org/debian"
SYSTEM_PATH = "/usr/sbin:/usr/bin:/sbin:/bin"
ARCH = subprocess.run(
    ["dpkg", "--print-architecture"], capture_output=True, text=True, check=True
).stdout.strip()
# Debian's library folder name for it (usr/lib/<this>), e.g. x86_64-linux-gnu
MULTIARCH = subprocess.run(
    ["dpkg-architecture", "-qDEB_HOST_MULTIARCH"], capture_output=True, text=True, check=True
).stdout.strip()
# lintian warnings that remain, each explained in docs/install.md ("Installing the Debian package").
EXPECTED_LINTIAN_WARNINGS: set[str] = set()
# What the package installs outside its Python folder (dpkg -c), and what it must never ship.
INSTALLED = (
    "/usr/bin/gpuhook",
    "/usr/bin/gpuhook-runtime",
    "/usr/bin/nvidia-container-runtime-hook",
    "/etc/gpuhook/config.yaml",
    "/etc/logrotate.d/gpuhook",
    "/lib/systemd/system/gpuhook-inventory.service",
    "/lib/systemd/system/gpuhook-inventory.path",
    "/lib/systemd/system/gpuhook-runtime.service",
    "/lib/systemd/system/gpuhook-nri.service",
    "/usr/lib/python3/dist-packages/gpuhook/nri/nri_api_pb2.py",
    "/lib/systemd/system/gpuhook-metrics.service",
    "/usr/lib/python3/dist-packages/gpuhook/_shim_entry.py",
    "/usr/lib/python3/dist-packages/gpuhook/schemas/config.schema.json",
    "/usr/lib/python3/dist-packages/gpuhook/schemas/cdi.schema.json",
    "/usr/lib/python3/dist-packages/gpuhook/schemas/cdi.defs.json",
    "/usr/share/man/man1/gpuhook.1.gz",
    "/usr/share/man/man1/gpuhook-runtime.1.gz",
    "/usr/share/doc/gpuhook/copyright",
)
# Paths the two packages or their use may create on a host (checked absent after a purge).
FOOTPRINT = (
    "/etc/gpuhook",
    "/var/lib/gpuhook",
    "/var/log/gpuhook",
    "/usr/bin/gpuhook",
    "/usr/bin/gpuhook-runtime",
    "/usr/bin/nvidia-container-runtime-hook",
    "/etc/logrotate.d/gpuhook",
    "/lib/systemd/system/gpuhook-inventory.service",
    "/lib/systemd/system/gpuhook-inventory.path",
    "/etc/systemd/system/multi-user.target.wants/gpuhook-inventory.service",
    "/etc/systemd/system/paths.target.wants/gpuhook-inventory.path",
    "/lib/systemd/system/gpuhook-runtime.service",
    "/etc/systemd/system/multi-user.target.wants/gpuhook-runtime.service",
    "/lib/systemd/system/gpuhook-metrics.service",
    "/etc/systemd/system/multi-user.target.wants/gpuhook-metrics.service",
    "/run/gpuhook/runtime.sock",
    "/usr/lib/python3/dist-packages/gpuhook",
    "/usr/share/doc/gpuhook",
    "/usr/share/man/man1/gpuhook.1.gz",
    "/usr/lib/python3/dist-packages/pynvml.py",
    "/usr/share/doc/python3-nvidia-ml-py",
)
# Suites that run again against the installed executables (each must be in the checkout).
INSTALLED_SUITES = (
    "tests/integration/test_shim.py",
    "tests/integration/test_leak_matrix.py",
    "tests/integration/test_inventory.py",
    "tests/integration/test_docker.py",
)


def sh(*argv: str, **kw: object) -> subprocess.CompletedProcess[str]:
    kw.setdefault("capture_output", True)
    kw.setdefault("text", True)
    kw.setdefault("check", False)
    kw.setdefault("timeout", 900)
    return subprocess.run(argv, **kw)  # type: ignore[call-overload,no-any-return]  # noqa: PLW1510


def changelog_version(folder: str) -> str:
    out = sh(
        "dpkg-parsechangelog",
        "-l",
        str(REPO / "packaging" / folder / "debian/changelog"),
        "-S",
        "Version",
    )
    assert out.returncode == 0, out.stderr
    return out.stdout.strip()


def debian_version() -> str:
    return changelog_version("deb")


NVML_VERSION = changelog_version("nvidia-ml-py")  # e.g. 12.570.86-1
NVML_UPSTREAM = NVML_VERSION.rsplit("-", 1)[0]
NVML_DEB = f"python3-nvidia-ml-py_{NVML_VERSION}_all.deb"


# --- make deb ------------------------------------------------------------------------------------


class Built:
    def __init__(self, copy: Path, log: str) -> None:
        self.copy = copy
        self.deb = copy / "dist" / f"gpuhook_{debian_version()}_{ARCH}.deb"
        self.nvml_deb = copy / "dist" / NVML_DEB
        self.sdist = copy / "build" / "nvidia-ml-py" / f"nvidia_ml_py-{NVML_UPSTREAM}.tar.gz"
        self.log = log

    @property
    def debs(self) -> list[Path]:
        return sorted((self.copy / "dist").glob("*.deb"))


def clean_copy(folder: Path) -> Path:
    """This checkout's files (tracked and untracked-not-ignored, as a clean clone of a commit of
    this tree has them) in ``folder``/gpuhook, made a git checkout as a clone is."""
    copy = folder / "gpuhook"
    copy.mkdir()
    files = sh("git", "ls-files", "-z", "--cached", "--others", "--exclude-standard", cwd=REPO)
    assert files.returncode == 0, files.stderr
    for name in filter(None, files.stdout.split("\0")):
        src = REPO / name
        if src.is_symlink() or src.is_file():
            dest = copy / name
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest, follow_symlinks=False)
    sh("git", "init", "-q", cwd=copy)
    sh("git", "add", "-A", cwd=copy)
    return copy


BUILD_ENV = {"PATH": SYSTEM_PATH, "LC_ALL": "C.UTF-8"}


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> Built:
    """``make deb`` in a clean copy of this checkout: both packages in its dist/."""
    copy = clean_copy(tmp_path_factory.mktemp("clone"))
    out = sh("make", "deb", cwd=copy, env={**BUILD_ENV, "HOME": str(copy)})
    assert out.returncode == 0, out.stdout[-4000:] + out.stderr[-4000:]
    result = Built(copy, out.stdout + out.stderr)
    assert result.debs == sorted([result.deb, result.nvml_deb]), out.stdout[-2000:]
    return result


def test_make_deb_on_a_clean_copy_passes_lintian(built: Built) -> None:
    tags = [line.split()[:3] for line in built.log.splitlines() if line[:2] in ("E:", "W:")]
    assert [t for t in tags if t[0] == "E:"] == []
    assert {t[2] for t in tags if t[0] == "W:"} == EXPECTED_LINTIAN_WARNINGS
    lintian = sh("lintian", "--fail-on", "error,warning", str(built.deb), env={"PATH": SYSTEM_PATH})
    assert lintian.returncode == (1 if EXPECTED_LINTIAN_WARNINGS else 0), lintian.stdout
    # The bindings' package, source and binary (its build fails on any warning itself).
    changes = built.sdist.parent / f"python-nvidia-ml-py_{NVML_VERSION}_{ARCH}.changes"
    lintian = sh("lintian", "--fail-on", "error,warning", str(changes), env={"PATH": SYSTEM_PATH})
    assert lintian.returncode == 0, lintian.stdout
    # Nothing fetched was committed (or laid in the tree make deb copies).
    tracked = sh("git", "ls-files", cwd=REPO).stdout.split()
    assert not [p for p in tracked if p.endswith((".tar.gz", ".whl", ".deb"))]


def test_deb_contents(built: Built) -> None:
    listing = sh("dpkg-deb", "-c", str(built.deb)).stdout
    paths = {line.split()[5].removeprefix(".") for line in listing.splitlines()}
    for path in INSTALLED:
        assert path in paths
    units = {p.name for p in (REPO / "packaging" / "systemd").iterdir()}
    shipped = {p.rsplit("/", 1)[1] for p in paths if p.startswith("/lib/systemd/system/")}
    assert shipped - {""} == units
    assert not [p for p in paths if "__pycache__" in p or p.endswith(".pyc")]
    assert not [p for p in paths if "pynvml" in p or "vendor" in p]
    fields = sh("dpkg-deb", "-f", str(built.deb), "Depends", "Architecture").stdout
    for dep in ("python3-click", "python3-yaml", "python3-jsonschema", "python3-structlog"):
        assert dep in fields
    assert f"python3-nvidia-ml-py (>= {nvml.PYNVML_MINIMUM})," in fields + ","
    assert "| python3-pynvml" not in fields  # an unversioned alternative gpuhook would refuse
    assert "runc | crun" in fields and f"Architecture: {ARCH}" in fields
    control = Path(sh("mktemp", "-d").stdout.strip())
    try:
        assert sh("dpkg-deb", "-e", str(built.deb), str(control)).returncode == 0
        assert (control / "conffiles").read_text().split() == [
            "/etc/gpuhook/config.yaml",
            "/etc/logrotate.d/gpuhook",
        ]
    finally:
        shutil.rmtree(control)
    extracted = Path(sh("mktemp", "-d").stdout.strip())
    try:
        assert sh("dpkg-deb", "-x", str(built.deb), str(extracted)).returncode == 0
        runtime = (extracted / "usr/bin/gpuhook-runtime").read_bytes()
        assert dispatch.command_of(runtime) == [
            "/usr/bin/python3",
            "-I",
            "-S",
            "/usr/lib/python3/dist-packages/gpuhook/_shim_entry.py",
        ]
        with pytest.raises(NodeInstallError, match="no program interpreter"):  # static
            bundle.interpreter_of(str(extracted / "usr/bin/gpuhook-runtime"))
        assert (extracted / "etc/gpuhook/config.yaml").read_bytes() == (
            REPO / "config" / "config.yaml.example"
        ).read_bytes()
    finally:
        shutil.rmtree(extracted)


def sdist_file(sdist: Path, name: str) -> bytes:
    with tarfile.open(sdist) as tar:
        member = tar.extractfile(f"nvidia_ml_py-{NVML_UPSTREAM}/{name}")
        assert member is not None
        return member.read()


def test_nvml_bindings_deb_is_the_pinned_sdist(built: Built, tmp_path: Path) -> None:
    pin = (REPO / "packaging/nvidia-ml-py/SHA256SUMS").read_text().split()
    assert pin == [hashlib.sha256(built.sdist.read_bytes()).hexdigest(), built.sdist.name]
    fields = sh("dpkg-deb", "-f", str(built.nvml_deb)).stdout
    for field in (
        "Package: python3-nvidia-ml-py",
        f"Version: {NVML_VERSION}",
        "Architecture: all",
        f"Provides: python3-pynvml (= {NVML_VERSION})",
        "Conflicts: python3-pynvml",
    ):
        assert field in fields.splitlines()
    listing = sh("dpkg-deb", "-c", str(built.nvml_deb)).stdout
    paths = {line.split()[5].removeprefix(".") for line in listing.splitlines()}
    site = "/usr/lib/python3/dist-packages"
    assert {p for p in paths if p.startswith(f"{site}/") and not p.endswith("/")} == {
        f"{site}/pynvml.py",
        *(
            f"{site}/nvidia_ml_py-{NVML_UPSTREAM}.egg-info/{name}"
            for name in ("PKG-INFO", "dependency_links.txt", "top_level.txt")
        ),
    }  # upstream's example.py is not a top-level module: it is an example
    assert "/usr/share/doc/python3-nvidia-ml-py/examples/example.py" in paths
    assert sh("dpkg-deb", "-x", str(built.nvml_deb), str(tmp_path)).returncode == 0
    # The module unmodified, and debian/copyright carries the sdist's own license terms.
    assert (tmp_path / f"{site[1:]}/pynvml.py").read_bytes() == sdist_file(built.sdist, "pynvml.py")
    header = sdist_file(built.sdist, "pynvml.py").decode().split("#####")[1]
    terms = header[header.index("Redistribution") :].replace("#", " ")
    copyright = (tmp_path / "usr/share/doc/python3-nvidia-ml-py/copyright").read_text()
    license_text = " ".join(copyright.replace("\n .\n", "\n").split())
    assert " ".join(terms.split()) in license_text
    assert "Copyright: 2011-2023 NVIDIA Corporation" in copyright


def test_a_sdist_other_than_the_pin_is_never_built(tmp_path: Path) -> None:
    """A wrong pin (or a wrong file already in build/): pip refuses the download before running
    anything of it, and no package is made."""
    copy = clean_copy(tmp_path)
    sums = copy / "packaging/nvidia-ml-py/SHA256SUMS"
    sums.write_text(sums.read_text().replace(sums.read_text()[:64], "0" * 64))
    planted = copy / "build/nvidia-ml-py" / f"nvidia_ml_py-{NVML_UPSTREAM}.tar.gz"
    planted.parent.mkdir(parents=True)
    planted.write_bytes(b"not the release")
    out = sh(
        "packaging/nvidia-ml-py/build-deb",
        "--no-lintian",
        cwd=copy,
        env={**BUILD_ENV, "HOME": str(copy)},
    )
    assert out.returncode != 0
    assert "DO NOT MATCH THE HASHES" in out.stderr, out.stderr[-3000:]
    assert not planted.exists()
    assert not (copy / "dist").exists()


# --- a fresh Debian 12 root ----------------------------------------------------------------------


def base_tarball() -> Path:
    """A debootstrapped bookworm (minbase) with its apt lists, as a tarball in build/; made once
    (under a lock) and reused. Downloaded .debs are kept in build/debian-bookworm/debs."""
    CACHE.mkdir(parents=True, exist_ok=True)
    tarball = CACHE / "bookworm-minbase.tar"
    with open(CACHE / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if tarball.exists():
            return tarball
        root = CACHE / "root.tmp"
        if root.exists():
            sh("umount", "-l", str(root / "proc"))
            shutil.rmtree(root)
        (CACHE / "debs").mkdir(exist_ok=True)
        out = sh(
            "debootstrap",
            "--variant=minbase",
            f"--cache-dir={CACHE / 'debs'}",
            "bookworm",
            str(root),
            MIRROR,
            env={"PATH": SYSTEM_PATH, "LC_ALL": "C.UTF-8"},
        )
        assert out.returncode == 0, out.stdout[-3000:] + out.stderr[-3000:]
        with Chroot(root) as chroot:
            update = chroot.run("apt-get", "update", "-q")
            assert update.returncode == 0, update.stdout + update.stderr
        tmp = CACHE / "bookworm-minbase.tar.tmp"
        out = sh("tar", "--numeric-owner", "-C", str(root), "-cf", str(tmp), ".")
        assert out.returncode == 0, out.stderr
        os.replace(tmp, tarball)
        shutil.rmtree(root)
    return tarball


class Chroot:
    """A Debian root with /proc mounted, apt's archive folder on the shared cache, no services
    started (policy-rc.d) and the host's resolv.conf. Unmounts on exit."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.mounts: list[Path] = []

    def __enter__(self) -> Chroot:
        policy = self.root / "usr/sbin/policy-rc.d"
        policy.write_text("#!/bin/sh\nexit 101\n")
        policy.chmod(0o755)
        shutil.copy(Path("/etc/resolv.conf").resolve(), self.root / "etc/resolv.conf")
        self._mount("-t", "proc", "proc", target=self.root / "proc")
        archives = CACHE / "archives"
        (archives / "partial").mkdir(parents=True, exist_ok=True)
        self._mount("--bind", str(archives), target=self.root / "var/cache/apt/archives")
        return self

    def _mount(self, *args: str, target: Path) -> None:
        out = sh("mount", *args, str(target))
        assert out.returncode == 0, out.stderr
        self.mounts.append(target)

    def __exit__(self, *exc: object) -> None:
        for target in reversed(self.mounts):
            if sh("umount", str(target)).returncode != 0:
                sh("umount", "-l", str(target))
        self.mounts.clear()

    def run(
        self, *argv: str, env: dict[str, str] | None = None
    ) -> subprocess.CompletedProcess[str]:
        full = {
            "PATH": SYSTEM_PATH,
            "HOME": "/root",
            "LC_ALL": "C.UTF-8",
            "DEBIAN_FRONTEND": "noninteractive",
            **(env or {}),
        }
        return sh("chroot", str(self.root), *argv, env=full, stdin=subprocess.DEVNULL)

    def ok(self, *argv: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
        out = self.run(*argv, env=env)
        assert out.returncode == 0, f"{argv}: {out.stdout[-3000:]}{out.stderr[-3000:]}"
        return out

    def files(self) -> set[str]:
        """Every path in the root (relative, no mount points' contents): a snapshot."""
        skip = {self.root / "proc", self.root / "var/cache/apt/archives"}
        found: set[str] = set()
        for folder, dirs, names in os.walk(self.root):
            here = Path(folder)
            dirs[:] = [d for d in dirs if here / d not in skip]
            for name in dirs + names:
                found.add("/" + str((here / name).relative_to(self.root)))
        return found


# dpkg's and apt's own bookkeeping and logs: they record that a package came and went.
BOOKKEEPING = (
    "/var/lib/dpkg/",
    "/var/lib/apt/",
    "/var/cache/apt/",
    "/var/cache/debconf/",
    "/var/cache/ldconfig/",
    "/var/log/",
)


def differences(left: set[str], right: set[str]) -> list[str]:
    """Paths in one snapshot and not the other, bookkeeping aside."""
    return sorted(p for p in left ^ right if not p.startswith(BOOKKEEPING))


@contextlib.contextmanager
def debian_root(folder: Path) -> Iterator[Chroot]:
    """A fresh bookworm root in ``folder`` (from the cached tarball), set up for chroot."""
    tarball = base_tarball()
    folder.mkdir()
    out = sh("tar", "--numeric-owner", "-C", str(folder), "-xpf", str(tarball))
    assert out.returncode == 0, out.stderr
    try:
        with Chroot(folder) as chroot:
            yield chroot
    finally:
        # About 300 MB each: removed, but only once nothing is mounted under it any more.
        mounts = Path("/proc/self/mountinfo").read_text().split()
        if not any(m == str(folder) or m.startswith(f"{folder}/") for m in mounts):
            shutil.rmtree(folder, ignore_errors=True)


def fake_nvml_library(tmp_path: Path) -> tuple[Path, str]:
    """The fake node's libnvidia-ml (its data is embedded, with dev_root /) and the driver
    version it reports."""
    node = make_fake_node(tmp_path / "node", "--gpus", "2")
    found = sorted((node.root / "build").glob("libnvidia-ml.so.*.*"))
    assert found, list((node.root / "build").iterdir())
    return found[0], str(node.truth["driver_version"])


def test_install_use_remove_purge_in_a_fresh_debian_root(built: Built, tmp_path: Path) -> None:
    with debian_root(tmp_path / "root") as chroot:
        pulled = install_and_use(chroot, built)
        refresh_on_the_fake_node(chroot, tmp_path / "fake")
        after_purge = remove_and_purge(chroot, built)
        reinstall_on_a_node_with_a_driver(chroot, built, tmp_path)
    # The same dependencies installed on their own in another fresh root: the root that had
    # gpuhook installed, used, removed and purged must hold exactly the same files.
    with debian_root(tmp_path / "baseline") as baseline:
        copy_debs(built, baseline)
        others = sorted(pulled - {"python3-nvidia-ml-py"})
        baseline.ok("apt-get", "install", "-y", "-q", *others, f"/tmp/dist/{NVML_DEB}")
        assert differences(after_purge, baseline.files()) == []


def copy_debs(built: Built, chroot: Chroot) -> None:
    (chroot.root / "tmp/dist").mkdir()
    for deb in built.debs:
        shutil.copy(deb, chroot.root / "tmp/dist" / deb.name)


def install_and_use(chroot: Chroot, built: Built) -> set[str]:
    """``apt-get install ./dist/*.deb``: the packages apt installed besides gpuhook."""
    copy_debs(built, chroot)
    before = {
        p.split()[0]
        for p in chroot.ok("dpkg-query", "-W", "-f", "${Package}\\n").stdout.split("\n")
        if p
    }

    # apt pulls the dependencies from Debian, the bindings from dist/.
    install = chroot.ok("sh", "-c", "cd /tmp && apt-get install -y -q ./dist/*.deb")
    status = chroot.ok("dpkg-query", "-W", "-f", "${Package} ${Version} ${Status}\\n").stdout
    installed = {
        line.split()[0]: line.split()[1]
        for line in status.splitlines()
        if line.endswith(" installed")
    }
    for dep in (
        "gpuhook",
        "python3-click",
        "python3-yaml",
        "python3-jsonschema",
        "python3-structlog",
        "python3-tomlkit",
        "runc",
    ):
        assert dep in installed
    assert installed["python3-nvidia-ml-py"] == NVML_VERSION
    assert "no NVIDIA driver found: inventory not refreshed" in install.stdout
    assert "/etc/gpuhook/config.yaml: valid (runtime /usr/sbin/runc)" in install.stdout
    assert "gpuhook runtime configure --runtime docker --set-as-default" in install.stdout

    # The installed executables work.
    version = debian_version()  # a native package: the upstream version
    assert chroot.ok("gpuhook", "--version").stdout == f"gpuhook {version}\n"
    assert chroot.ok("gpuhook", "config", "validate").stdout == (
        "/etc/gpuhook/config.yaml: valid (runtime /usr/sbin/runc)\n"
    )
    lines = chroot.ok("gpuhook-runtime", "--version").stdout.splitlines()
    assert lines[0] == f"gpuhook-runtime {version} (gpuhook), wrapping /usr/sbin/runc"
    assert lines[1].startswith("runc version")
    hook = chroot.run("nvidia-container-runtime-hook", "prestart")
    assert hook.returncode == 1 and "needs gpuhook-runtime" in hook.stderr
    assert (
        chroot.root / "etc/systemd/system/paths.target.wants/gpuhook-inventory.path"
    ).is_symlink()
    assert (
        chroot.root / "etc/systemd/system/multi-user.target.wants/gpuhook-runtime.service"
    ).is_symlink()
    pointer = chroot.root / "run/gpuhook/config/etc/gpuhook/config.yaml/runtime"
    assert pointer.read_text().splitlines()[0] == "/usr/sbin/runc"
    return set(installed) - before - {"gpuhook"}


def refresh_on_the_fake_node(chroot: Chroot, folder: Path) -> None:
    """``gpuhook inventory refresh`` on a fake node (laid in the root at its own path) reads it
    through the packaged pynvml; the step leaves nothing in the root outside the node's folder
    (/run is a tmpfs here, as on a booted node, for the config cache)."""
    node = make_fake_node(folder, "--gpus", "2", "--runtime", "/usr/sbin/runc")
    before = chroot.files()
    inside = chroot.root / str(node.root).lstrip("/")
    top = next(p for p in [*reversed(inside.parents), inside] if not p.exists())
    inside.parent.mkdir(parents=True, exist_ok=True)
    assert sh("cp", "-a", str(node.root), str(inside)).returncode == 0
    run = chroot.root / "run"
    assert sh("mount", "-t", "tmpfs", "tmpfs", str(run)).returncode == 0
    try:
        bindings = chroot.ok("python3", "-c", "import pynvml; print(pynvml.__file__)").stdout
        assert bindings == "/usr/lib/python3/dist-packages/pynvml.py\n"
        owner = chroot.ok("dpkg", "-S", bindings.strip()).stdout
        assert owner.startswith("python3-nvidia-ml-py: ")
        # the chroot's own cache folder, on its /run tmpfs (not the test session's, which the
        # fake node's env names: that folder would be made inside the root)
        env = {**node.env, "GPUHOOK_CACHE_DIR": "/run/gpuhook/config"}
        refresh = chroot.ok("gpuhook", "inventory", "refresh", env=env)
        assert refresh.stdout.startswith(f"{node.root}/state/inventory.json: 2 GPUs"), refresh
        view = json.loads(chroot.ok("gpuhook", "inspect", "node", "-o", "json", env=env).stdout)
        assert [g["uuid"] for g in view["gpus"]] == [g["uuid"] for g in node.truth["gpus"]]
        assert view["driver"]["version"] == node.truth["driver_version"]
    finally:
        assert sh("umount", str(run)).returncode == 0
    shutil.rmtree(top)
    assert differences(before, chroot.files()) == []


def remove_and_purge(chroot: Chroot, built: Built) -> set[str]:
    """The root's files after ``dpkg -r`` and ``dpkg -P`` of gpuhook."""
    # Removal keeps the conffiles and warns about a default runtime it would leave dangling.
    daemon = chroot.root / "etc/docker/daemon.json"
    daemon.parent.mkdir()
    daemon_text = json.dumps(
        {
            "default-runtime": "gpuhook",
            "runtimes": {"gpuhook": {"path": "/usr/bin/gpuhook-runtime"}},
        }
    )
    daemon.write_text(daemon_text)
    remove = chroot.ok("dpkg", "-r", "gpuhook")
    warning = "gpuhook: WARNING: /etc/docker/daemon.json still makes gpuhook the default runtime"
    assert f"{warning} of docker" in remove.stderr
    assert daemon.read_text() == daemon_text
    assert (chroot.root / "etc/gpuhook/config.yaml").is_file()
    assert not (chroot.root / "usr/bin/gpuhook-runtime").exists()
    assert not (chroot.root / "run/gpuhook").exists()
    assert not (chroot.root / "usr/lib/python3/dist-packages/gpuhook").exists()
    shutil.rmtree(daemon.parent)

    # Purge leaves nothing of gpuhook.
    chroot.ok("dpkg", "-P", "gpuhook")
    after = chroot.files()
    assert [p for p in after if "gpuhook" in p and not p.startswith("/tmp/dist")] == []
    return after


def reinstall_on_a_node_with_a_driver(chroot: Chroot, built: Built, tmp_path: Path) -> None:
    # A node with an NVIDIA driver (the fake NVML library): postinst refreshes the inventory
    # through the packaged bindings (python3-nvidia-ml-py, still installed).
    lib, driver_version = fake_nvml_library(tmp_path)
    libdir = chroot.root / "usr/lib" / MULTIARCH
    shutil.copy(lib, libdir / lib.name)
    (libdir / "libnvidia-ml.so.1").symlink_to(lib.name)
    chroot.ok("ldconfig")
    with_driver = chroot.files()
    install = chroot.ok("dpkg", "-i", f"/tmp/dist/{built.deb.name}")
    assert "/var/lib/gpuhook/inventory.json: 0 GPUs" in install.stdout, install.stdout
    node = json.loads(chroot.ok("gpuhook", "inspect", "node", "-o", "json").stdout)
    assert node["driver"]["version"] == driver_version
    chroot.ok("dpkg", "-P", "gpuhook")
    assert chroot.files() - with_driver == set()
    assert with_driver - chroot.files() == set()
    # Purging the bindings leaves none of their files.
    chroot.ok("dpkg", "-P", "python3-nvidia-ml-py")
    left = [
        p
        for p in differences(set(), chroot.files())
        if ("pynvml" in p or "nvidia-ml-py" in p or "nvidia_ml_py" in p)
        and not p.startswith("/tmp/dist/")
    ]
    assert left == []


# --- this host ---------------------------------------------------------------------------------


def host_has_gpuhook_files() -> list[str]:
    present = [p for p in FOOTPRINT if os.path.lexists(p)]
    site = Path("/usr/lib/python3/dist-packages")
    present += [str(p) for p in site.glob("gpuhook-*.dist-info")]
    present += [str(p) for p in site.glob("nvidia_ml_py-*.egg-info")]
    for package in ("gpuhook", "python3-nvidia-ml-py"):
        status = sh("dpkg-query", "-W", "-f", "${Status}", package).stdout
        present += [f"package {package}: {status}"] if "installed" in status else []
    return present


def test_installed_on_this_host(built: Built, containers: Containers, tmp_path: Path) -> None:
    leftovers = host_has_gpuhook_files()
    if leftovers:
        pytest.skip(f"this host already has gpuhook files, not touching them: {leftovers}")
    try:
        install = sh("dpkg", "-i", *map(str, built.debs), env=BUILD_ENV)
        assert install.returncode == 0, install.stdout + install.stderr

        # A real runc container through the installed gpuhook-runtime, on a fake node whose
        # hooks are the installed gpuhook (NVML through the installed bindings).
        node = make_fake_node(tmp_path / "node", "--gpus", "2", "--hook-path", "/usr/bin/gpuhook")
        refresh = subprocess.run(
            ["/usr/bin/gpuhook", "inventory", "refresh"],
            env={**os.environ, **node.env},
            capture_output=True,
            text=True,
            check=False,
        )
        assert refresh.returncode == 0, refresh.stderr
        env = {**node.env}
        gpu = containers.bundle(
            args=("/bin/sh", "-c", testbed.PROBE), env=["NVIDIA_VISIBLE_DEVICES=1"]
        )
        out = containers.run(gpu, env, runtime="/usr/bin/gpuhook-runtime")
        assert out.returncode == 0, out.stderr
        seen = testbed.parse_probe(out.stdout)
        assert "/dev/nvidia1" in seen["dev"] and "/dev/nvidia0" not in seen["dev"]
        assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == node.truth["gpus"][1]["uuid"]
        assert any("libcuda.so.1" in line for line in seen["ldconfig"])  # the installed hook ran
        plain = containers.bundle(args=("/bin/sh", "-c", testbed.PROBE))
        out = containers.run(plain, env, runtime="/usr/bin/gpuhook-runtime")
        assert out.returncode == 0, out.stderr
        assert testbed.parse_probe(out.stdout)["dev"] == []

        # The integration suites again, against the installed executables.
        assert [s for s in INSTALLED_SUITES if not (REPO / s).exists()] == []
        rerun = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *INSTALLED_SUITES],
            cwd=REPO,
            env={**os.environ, "GPUHOOK_TEST_EXECUTABLES": "/usr/bin"},
            capture_output=True,
            text=True,
            check=False,
            timeout=1800,
        )
        assert rerun.returncode == 0, rerun.stdout[-6000:] + rerun.stderr[-3000:]

    finally:
        purge = sh("dpkg", "-P", "gpuhook", "python3-nvidia-ml-py", env=BUILD_ENV)
    assert purge.returncode == 0, purge.stdout + purge.stderr
    assert host_has_gpuhook_files() == []
