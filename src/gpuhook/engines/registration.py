"""The pure registration edits (text in, text out) of the engines gpuhook registers with:
docker (:mod:`.docker`), containerd (:mod:`.containerd`; its drop-in files
:mod:`.containerd_dropin`, its TOML :mod:`.containerd_toml`), podman (:mod:`.podman`); what they
share is in :mod:`.common`, the table of engines (names, default configs, services) in
:mod:`.readers`. The file side (read, plan, diff, back up, write) is
:mod:`gpuhook.engines.configure`.
"""

from __future__ import annotations

from gpuhook.engines.common import DEFAULT_NAME, DEFAULT_RUNTIME_PATH, Edit, unified_diff
from gpuhook.engines.containerd import containerd_configure, containerd_unconfigure
from gpuhook.engines.containerd_dropin import containerd_dropin, containerd_remove_import
from gpuhook.engines.docker import docker_configure, docker_unconfigure
from gpuhook.engines.podman import podman_configure, podman_unconfigure

__all__ = [
    "DEFAULT_NAME",
    "DEFAULT_RUNTIME_PATH",
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
