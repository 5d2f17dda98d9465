"""The records folder's automatic upkeep (gpuhook.records.sweep): a sweep removes dangling links
(and their exec-env markers) and stale temporary links, keeps live ones, is due once per
interval, looks at a bounded number of entries, and works a backlog of 100,000 leftover links
down to nothing over creates that each look at no more than its budget."""

from __future__ import annotations

import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from gpuhook import fsutil
from gpuhook.config.types import Config
from gpuhook.records import execenv, sweep, writer
from tests import factories as f


def config_in(tmp_path: Path) -> Config:
    return f.config(state_dir=str(tmp_path / "state"))


def live(config: Config, tmp_path: Path, cid: str) -> Path:
    """A container whose bundle exists: its record and link, as a create writes them."""
    bundle = tmp_path / "bundles" / cid
    bundle.mkdir(parents=True)
    record = {"container_id": cid}
    (bundle / writer.RECORD_NAME).write_text(str(record))
    os.makedirs(config.records_dir, exist_ok=True)
    link = Path(config.records_dir) / f"{cid}.json"
    link.symlink_to(bundle / writer.RECORD_NAME)
    return bundle


def leftovers(config: Config, tmp_path: Path, count: int, prefix: str = "gone") -> None:
    """``count`` links of containers whose engine removed the bundle (what 100,000 creates and
    deletes left in the folder before deletes removed their links)."""
    os.makedirs(config.records_dir, exist_ok=True)
    folder = config.records_dir
    for i in range(count):
        target = f"{tmp_path}/deleted/{prefix}-{i}/{writer.RECORD_NAME}"
        os.symlink(target, f"{folder}/{prefix}-{i:06d}.json")


def names(config: Config) -> set[str]:
    return set(os.listdir(config.records_dir))


def test_a_sweep_removes_dangling_links_and_keeps_live_ones(tmp_path: Path) -> None:
    config = config_in(tmp_path)
    live(config, tmp_path, "alive")
    gone = live(config, tmp_path, "deleted")
    os.makedirs(os.path.join(config.state_dir, execenv.DIR))
    for cid in ("alive", "deleted"):
        marker = execenv.marker_path(config.state_dir, cid)
        Path(marker).write_text('{"set": []}')
        os.utime(marker, (time.time() - 3600,) * 2)
    shutil.rmtree(gone)  # the engine deleted the bundle, no delete came through gpuhook
    other = Path(config.records_dir) / "notes.txt"  # not a record link: never touched
    other.write_text("")
    old_temp = Path(fsutil.temp_name(f"{config.records_dir}/x.json"))
    old_temp.symlink_to("/nowhere")
    os.utime(old_temp, (time.time() - 3600,) * 2, follow_symlinks=False)
    new_temp = Path(fsutil.temp_name(f"{config.records_dir}/y.json"))
    new_temp.symlink_to("/nowhere")  # a create may be writing it now

    swept = sweep.run(config, time.time())

    assert (swept.removed, swept.more) == (2, False)
    assert names(config) == {"alive.json", "notes.txt", new_temp.name}
    assert os.path.exists(execenv.marker_path(config.state_dir, "alive"))
    assert not os.path.exists(execenv.marker_path(config.state_dir, "deleted"))


def test_a_sweep_is_due_once_per_interval_and_one_create_sweeps(tmp_path: Path) -> None:
    config = config_in(tmp_path)
    live(config, tmp_path, "alive")
    leftovers(config, tmp_path, 3)
    now = time.time()
    first = sweep.maybe(config, now)
    assert first is not None and first.removed == 3
    leftovers(config, tmp_path, 3, prefix="later")
    assert sweep.maybe(config, now + 1) is None  # one stat: not due
    assert len(names(config)) == 4  # alive, 3 new leftovers
    again = sweep.maybe(config, now + sweep.INTERVAL_S + 1)
    assert again is not None and again.removed == 3
    assert names(config) == {"alive.json"}


def test_a_sweep_looks_at_no_more_than_its_budget(tmp_path: Path) -> None:
    config = config_in(tmp_path)
    leftovers(config, tmp_path, 50)
    now = time.time()
    swept = sweep.run(config, now, budget=20)
    assert (swept.examined, swept.removed, swept.more) == (20, 20, True)
    assert len(names(config)) == 30
    rest = sweep.run(config, now, budget=20)
    assert (rest.examined, rest.removed, rest.more) == (20, 20, True)
    last = sweep.run(config, now, budget=20)
    assert (last.examined, last.removed, last.more) == (10, 10, False)
    assert names(config) == set()


@pytest.fixture
def memory_tmp(tmp_path: Path) -> Iterator[Path]:
    """A temp folder on tmpfs (the state folder of a node is /run or a disk; 100,000 links on a
    shared, busy disk cost minutes of journal writes that say nothing about gpuhook)."""
    if not os.path.isdir("/dev/shm"):
        yield tmp_path
        return
    folder = Path(tempfile.mkdtemp(prefix="gpuhook-test-sweep-", dir="/dev/shm"))
    yield folder
    shutil.rmtree(folder, ignore_errors=True)


def test_100000_leftover_links_are_worked_down_by_bounded_sweeps(memory_tmp: Path) -> None:
    """A node that ran 100,000 containers without their links removed: each due sweep looks at
    no more than BUDGET entries, the backlog makes the next one due after BACKLOG_S, and the
    folder ends with the live containers' links and the stamp alone."""
    tmp_path = memory_tmp
    config = config_in(tmp_path)
    leftovers(config, tmp_path, 100_000)
    for i in range(5):
        live(config, tmp_path, f"alive-{i}")
    now = time.time()
    sweeps = []
    while True:
        swept = sweep.maybe(config, now)
        assert swept is not None
        assert swept.examined <= sweep.BUDGET
        sweeps.append(swept)
        if not swept.more:
            break
        assert sweep.maybe(config, now + sweep.BACKLOG_S / 2) is None
        now += sweep.BACKLOG_S
    assert sum(s.removed for s in sweeps) == 100_000
    assert len(sweeps) <= 100_000 // (sweep.BUDGET - 5) + 1
    assert names(config) == {f"alive-{i}.json" for i in range(5)}
    assert sweep.maybe(config, now + 1) is None  # no backlog: the interval again


def test_a_link_replaced_while_it_was_found_dangling_is_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A create that reuses the id and bundle path between the sweep's check and its unlink
    keeps its link: the sweep puts it back when the record exists once it removed it."""
    config = config_in(tmp_path)
    bundle = live(config, tmp_path, "reused")
    record = bundle / writer.RECORD_NAME
    link = os.path.join(config.records_dir, "reused.json")
    real_stat = os.stat

    def stat_then_recreate(path: str, *a: object, **kw: object) -> os.stat_result:
        if path == link:
            record.unlink()
            try:
                return real_stat(path)
            finally:
                record.write_text("{}")  # the create of the same id writes its record
        return real_stat(path, *a, **kw)  # type: ignore[arg-type]

    monkeypatch.setattr(os, "stat", stat_then_recreate)
    swept = sweep.run(config, time.time())
    monkeypatch.undo()
    assert swept.removed == 0
    assert os.readlink(link) == str(record)


def test_a_marker_without_a_link_goes_once_it_is_a_minute_old(tmp_path: Path) -> None:
    """A crashed container's link swept before its marker was old enough to go with it: the
    marker goes in a later sweep; a fresh one (a create under way) and one with a link stay."""
    config = config_in(tmp_path)
    live(config, tmp_path, "alive")
    folder = Path(config.state_dir) / execenv.DIR
    folder.mkdir()
    now = time.time()
    for cid, age in (("alive", 3600), ("crashed", 3600), ("creating", 1)):
        (folder / cid).write_text('{"set": []}')
        os.utime(folder / cid, (now - age, now - age))
    swept = sweep.run(config, now)
    assert (swept.removed, swept.more) == (1, False)
    assert sorted(os.listdir(folder)) == ["alive", "creating"]


def test_forget_removes_the_link_of_a_deleted_container_only(tmp_path: Path) -> None:
    config = config_in(tmp_path)
    live(config, tmp_path, "a")
    live(config, tmp_path, "b")
    sweep.forget(config, "a")
    sweep.forget(config, "never-created")
    assert names(config) == {"b.json"}
