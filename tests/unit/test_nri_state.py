"""The NRI plugin's records: written outside any bundle, linked as every record, left alone by
`gpuhook gc` (the plugin removes them itself), removed by the plugin."""

from __future__ import annotations

import os
from pathlib import Path

from gpuhook.config import loading
from gpuhook.nri import state
from gpuhook.pipeline import request
from gpuhook.records import gc
from tests.logcapture import paper_node


def test_gc_keeps_the_plugins_records_and_the_plugin_removes_them(tmp_path: Path) -> None:
    config = loading.load(str(paper_node(tmp_path)), use_cache=False)
    cid = "c" * 64
    spec = {"process": {"env": ["NVIDIA_VISIBLE_DEVICES=all"]}, "annotations": {}}
    assert state.write(config, cid, request.parse(spec)) == ""
    link = Path(config.records_dir) / f"{cid}.json"
    assert os.readlink(link) == os.path.join(config.state_dir, "nri", cid, "gpuhook-decision.json")

    report = gc.gc(config, grace_s=0)
    assert [(i.container_id, i.removed) for i in report.items] == [(cid, False)]
    assert report.items[0].reason.startswith("kept: the NRI plugin's record")
    assert link.is_symlink()

    assert state.known(config) == [cid]
    state.forget(config, cid)
    assert not os.path.lexists(link) and state.known(config) == []
