"""cri-dockerd / dockershim pods through a real dockerd (issue 19, item 1): docker writes no
io.kubernetes.* annotation into the OCI spec, so gpuhook knows a pod container only by the
kubelet's per-pod bind mounts, which cri-dockerd passes as `docker run -v` binds. Runs with the
private dockerd of test_docker.py (its `docker` fixture), gpuhook as its default runtime."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests import factories as f
from tests.integration.test_docker import IMAGE_ALL, Docker, docker, gpus  # noqa: F401
from tests.integration.test_k8s_trust import kubelet
from tests.integration.test_leak_matrix import write_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.root]


def kubelet_binds(root: Path, uid: str = "pod-uid-1", container: str = "main") -> list[str]:
    pod = root / "pods" / uid
    return [
        "-v", f"{pod / 'etc-hosts'}:/etc/hosts",
        "-v", f"{pod / 'containers' / container / f.TERMINATION_LOG_NAME}:/dev/termination-log",
    ]  # fmt: skip


@pytest.mark.parametrize(("allocated", "want"), [([], []), ([2], gpus(2))])
def test_dockershim_pod_gets_only_its_allocation(
    docker: Docker,  # noqa: F811
    tmp_path: Path,
    allocated: list[int],
    want: list[str],
) -> None:
    """The image says NVIDIA_VISIBLE_DEVICES=all and standalone env requests are trusted: before,
    the pod looked standalone and got all 8 GPUs."""
    root = kubelet(tmp_path)
    uuids = [str(docker.node.truth["gpus"][i]["uuid"]) for i in allocated]
    write_checkpoint(
        root / "device-plugins" / "kubelet_internal_checkpoint", [("pod-uid-1", "main", uuids)]
    )
    docker.set_policy(
        standalone={"env_requests": "trust"},
        kubernetes={"env_requests": "verify", "kubelet_dir": str(root)},
    )
    seen = docker.run(*kubelet_binds(root), image=IMAGE_ALL)
    assert seen["returncode"] == 0, docker.why(seen)
    assert seen["dev"] == want
    assert seen["env"]["NVIDIA_VISIBLE_DEVICES"] == (uuids[0] if uuids else "void")
