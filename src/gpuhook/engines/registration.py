"""The engines gpuhook registers with, and their pure registration edits (text in, text out):
docker (:mod:`.docker`), containerd (:mod:`.containerd`), podman (:mod:`.podman`); what they
share is in :mod:`.common`. The file side (read, plan, diff, back up, write) is
:mod:`gpuhook.engines.configure`.
"""

from __future__ import annotations

from gpuhook.engines import containerd, docker, podman
from gpuhook.engines.common import DEFAULT_NAME, DEFAULT_RUNTIME_PATH, Edit, unified_diff
from gpuhook.engines.containerd import (
    containerd_configure,
    containerd_dropin,
    containerd_remove_import,
    containerd_unconfigure,
)
from gpuhook.engines.docker import docker_configure, docker_unconfigure
from gpuhook.engines.podman import podman_configure, podman_unconfigure

DOCKER = "docker"
CONTAINERD = "containerd"
PODMAN = "podman"
ENGINES = (DOCKER, CONTAINERD, PODMAN)
DEFAULT_CONFIG = {
    DOCKER: docker.DEFAULT_CONFIG,
    CONTAINERD: containerd.DEFAULT_CONFIG,
    PODMAN: podman.DEFAULT_CONFIG,
}
SERVICE = {DOCKER: docker.SERVICE, CONTAINERD: containerd.SERVICE, PODMAN: podman.SERVICE}

__all__ = [
    "CONTAINERD",
    "DEFAULT_CONFIG",
    "DEFAULT_NAME",
    "DEFAULT_RUNTIME_PATH",
    "DOCKER",
    "ENGINES",
    "PODMAN",
    "SERVICE",
    "Edit",
    "containerd_configure",
    "containerd_dropin",
    "containerd_remove_import",
    "containerd_unconfigure",
    "docker_configure",
    "docker_unconfigure",
    "podman_configure",
    "podman_unconfigure",
    "unified_diff",
]
