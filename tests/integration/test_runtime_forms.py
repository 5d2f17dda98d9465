"""Real runc through gpuhook-runtime: the argv forms runc accepts (issue 16.2) and the granted
environment of processes started with ``exec --process`` (issue 19, item 7 on exec)."""

from __future__ import annotations

import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import testbed

from gpuhook.records import execenv
from tests.conftest import Containers, FakeNode

pytestmark = [pytest.mark.slow, pytest.mark.root]


def call(
    env: dict[str, str], *args: str, cwd: str = "/", **kw: object
) -> subprocess.CompletedProcess[str]:
    out: subprocess.CompletedProcess[str] = subprocess.run(
        [testbed.RUNTIME, *args],
        env={"PATH": os.environ["PATH"], **env},
        cwd=cwd,
        text=True,
        check=False,
        stdin=subprocess.DEVNULL,
        timeout=60,
        **kw,  # type: ignore[call-overload]
    )
    return out


def wait_stopped(env: dict[str, str], state: str, cid: str) -> None:
    for _ in range(200):
        out = call(env, "--root", state, "state", cid, capture_output=True)
        if json.loads(out.stdout or "{}").get("status") == "stopped":
            return
        time.sleep(0.05)
    raise AssertionError(f"{cid} did not stop")


@pytest.mark.parametrize("gpu", [True, False])
def test_create_with_flags_after_the_id_from_root(
    node: FakeNode, containers: Containers, tmp_path: Path, gpu: bool
) -> None:
    """``gpuhook-runtime create ID --bundle X`` run from ``/`` creates the container of X (it
    failed with "no config.json in bundle /"); a GPU spec is decided, a plain one passed."""
    env = ["NVIDIA_VISIBLE_DEVICES=1"] if gpu else []
    bundle = containers.bundle(args=("/bin/sh", "-c", testbed.PROBE), env=env)
    state, cid = str(containers.state), f"after-{int(gpu)}"
    log = tmp_path / "out.txt"
    with open(log, "w") as out:
        created = call(node.env, "--root", state, "create", cid, "--bundle", str(bundle),
                       stdout=out, stderr=subprocess.STDOUT)  # fmt: skip
    assert created.returncode == 0, log.read_text()
    assert call(node.env, "--root", state, "start", cid).returncode == 0
    wait_stopped(node.env, state, cid)
    assert call(node.env, "--root", state, "delete", cid).returncode == 0
    seen = testbed.parse_probe(log.read_text())
    gpus = [d for d in seen["dev"] if d.removeprefix("/dev/nvidia").isdigit()]
    assert gpus == (["/dev/nvidia1"] if gpu else []), seen


def test_exec_process_gets_the_granted_environment(
    node: FakeNode, containers: Containers, tmp_path: Path
) -> None:
    """containerd builds an exec'd process from its stored (unrewritten) spec: the image's
    ``all``. gpuhook puts the granted value into runc's --process file; delete drops the
    marker; a container without a grant keeps a pure pass-through."""
    state = str(containers.state)
    bundle = containers.bundle(args=("/bin/sh", "-c", "sleep 30"), env=["NVIDIA_VISIBLE_DEVICES=2"])
    cid = "exec-env"
    started = call(node.env, "--root", state, "run", "-d", "--bundle", str(bundle), cid,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)  # fmt: skip
    assert started.returncode == 0
    granted = [
        e
        for e in json.loads((bundle / "config.json").read_text())["process"]["env"]
        if e.startswith("NVIDIA_VISIBLE_DEVICES=")
    ]
    marker = Path(execenv.marker_path(node.truth["state_dir"], cid))
    process = tmp_path / "process.json"
    process.write_text(
        json.dumps(
            {
                "args": ["/bin/sh", "-c", "env | grep ^NVIDIA_ || true"],
                "env": ["PATH=/bin:/usr/bin", "NVIDIA_VISIBLE_DEVICES=all"],
                "cwd": "/",
                "user": {"uid": 0, "gid": 0},
            }
        )
    )
    try:
        assert marker.exists()
        out = call(node.env, "--root", state, "exec", "--process", str(process), cid,
                   capture_output=True)  # fmt: skip
        assert out.returncode == 0, out.stderr
        seen = [e for e in out.stdout.split() if e.startswith("NVIDIA_VISIBLE_DEVICES=")]
        assert seen == granted
        assert granted and granted != ["NVIDIA_VISIBLE_DEVICES=all"]
    finally:
        call(node.env, "--root", state, "kill", cid, "KILL")
        wait_stopped(node.env, state, cid)
        assert call(node.env, "--root", state, "delete", cid).returncode == 0
    assert not marker.exists()
