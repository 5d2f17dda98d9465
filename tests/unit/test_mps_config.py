"""``mps.*`` config: one-line errors naming file and key path (exit 2), and the frozen form."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from gpuhook.config import loading as config_loading
from gpuhook.errors import EXIT_CONFIG, ConfigError


def write(tmp_path: Path, text: str) -> str:
    path = tmp_path / "config.yaml"
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("mps:\n  gpus: [MIG-1234]\n", "mps.gpus[0]: 'MIG-1234' is a MIG device; MIG devices"),
        ("mps:\n  gpus: [0, '1:0']\n", "mps.gpus[1]: '1:0' is a MIG device; MIG devices cannot"),
        (
            "mps:\n  groups:\n    pair: {gpus: [0, MIG-GPU-ab/1/0]}\n",
            "mps.groups.pair.gpus[1]: 'MIG-GPU-ab/1/0' is a MIG device",
        ),
        ("mps:\n  gpus: [first]\n", "mps.gpus[0]: 'first' is not a GPU index, a GPU UUID"),
        ("mps:\n  active_thread_percentage: 0\n", "mps.active_thread_percentage: 0 is less than"),
        ("mps:\n  active_thread_percentage: 101\n", "mps.active_thread_percentage: 101 is greater"),
        ("mps:\n  replicas: 0\n", "mps.replicas: 0 is less than the minimum of 1"),
        ("mps:\n  pinned_memory_limit: 8X\n", "mps.pinned_memory_limit: '8X' is not a size"),
        (
            "mps:\n  groups:\n    p: {gpus: [0], pinned_memory_limit: 10}\n",
            "mps.groups.p.pinned_memory_limit: must be",
        ),
        ("mps:\n  oversubscription: maybe\n", "mps.oversubscription: 'maybe' is not one of"),
        (
            "mps:\n  shm: dev/shm\n",
            "mps.shm: must be group, empty, or (as before) an absolute path",
        ),
        ("mps:\n  pipe_size: 1K\n", "mps.pipe_size: '1K' is less than 1M"),
        ("mps:\n  shm_size: 150%\n", "mps.shm_size: '150%' is not a size"),
        ("mps:\n  root: run/mps\n", "mps.root: 'run/mps' does not match"),
        (
            "mps:\n  groups:\n    gpu3: {gpus: [0]}\n",
            "mps.groups.gpu3: gpu<index> is the name of a per-GPU group",
        ),
        ("mps:\n  groups:\n    p: {replicas: 2}\n", "mps.groups.p: 'gpus' is a required"),
        (
            "mps:\n  groups:\n    a: {gpus: [0]}\n    b: {gpus: [1, 0]}\n",
            "mps.groups.b.gpus[1]: GPU 0 is already in mps.groups.a.gpus",
        ),
        ("mps:\n  exclusive: true\n", "mps.exclusive: unknown key"),
        ("mps:\n  groups:\n    'a b': {gpus: [0]}\n", "mps.groups: 'a b' does not match"),
    ],
)
def test_bad_mps_config_is_one_line_with_key_path(tmp_path: Path, text: str, message: str) -> None:
    path = write(tmp_path, text)
    with pytest.raises(ConfigError) as info:
        config_loading.load(path, use_cache=False)
    line = str(info.value)
    assert message in line, line
    assert line.startswith(f"invalid config {path}: ") and "\n" not in line
    assert info.value.exit_code == EXIT_CONFIG


def test_mps_config_frozen_form(tmp_path: Path) -> None:
    path = write(
        tmp_path,
        "mps:\n  gpus: [all]\n  replicas: 4\n  groups:\n    pair: {gpus: [0, 3], replicas: 2}\n",
    )
    mps = config_loading.load(path, use_cache=False).mps
    assert mps.enabled and mps.gpus == ("all",) and mps.replicas == 4
    assert mps.root == "/run/gpuhook/mps" and mps.oversubscription == "reject"
    (pair,) = mps.groups
    assert (pair.name, pair.gpus, pair.replicas, pair.pinned_memory_limit) == (
        "pair",
        ("0", "3"),
        2,
        None,
    )
    assert not config_loading.load(write(tmp_path, "state_dir: /x\n"), use_cache=False).mps.enabled


def test_cli_names_the_mig_key_and_exits_2(tmp_path: Path) -> None:
    bad = write(tmp_path, "mps:\n  gpus: [0, MIG-abc]\n")
    out = subprocess.run(
        [sys.executable, "-m", "gpuhook", "config", "validate", bad],
        capture_output=True,
        text=True,
        check=False,
    )
    assert out.returncode == 2
    assert out.stderr == (
        f"gpuhook: invalid config {bad}: mps.gpus[1]: 'MIG-abc' is a MIG device; "
        "MIG devices cannot be MPS-shared\n"
    )


def test_the_daemon_pid_record_is_trusted_by_gpuhooks_one_file_rule(tmp_path: Path) -> None:
    """A pid record that others could have written (group/world-writable, a link) names no
    daemon: `gpuhook mps stop` and the create path never act on it."""
    import os

    from gpuhook.mps import daemons

    pipe = tmp_path / "group0" / "pipe"
    pipe.mkdir(parents=True)
    record = daemons.record_path(str(pipe))
    with open(record, "w") as fh:
        fh.write("4242\n")
    os.chmod(record, 0o644)
    assert daemons.recorded_pid(str(pipe)) == 4242
    for mode in (0o664, 0o646):
        os.chmod(record, mode)
        assert daemons.recorded_pid(str(pipe)) is None, oct(mode)
    os.chmod(record, 0o644)
    os.rename(record, record + ".real")
    os.symlink(record + ".real", record)
    assert daemons.recorded_pid(str(pipe)) is None
