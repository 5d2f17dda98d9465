"""Pods of the cluster suite: hostNetwork (no CNI here), local images only, the standard probe
of tools/testbed.py as their command; what they saw is read back from their logs."""

from __future__ import annotations

import json
from typing import Any

import testbed

from tests.integration.cluster.stack import Cluster

DONE = ("Succeeded", "Failed")


def pod(
    name: str,
    image: str,
    claims: list[tuple[str, str]] | None = None,
    limits: dict[str, str] | None = None,
    command: str = testbed.PROBE + "; exec sleep 3600",
) -> dict[str, Any]:
    """A pod running ``command`` (the probe, then it stays up: gpuhook's record of a container
    lives as long as the container); ``claims``: (name in the pod, ResourceClaimTemplate or
    ``claim:<ResourceClaim>``)."""
    container: dict[str, Any] = {
        "name": "main",
        "image": image,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c", command],
    }
    spec: dict[str, Any] = {
        "hostNetwork": True,
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "terminationGracePeriodSeconds": 0,
        "containers": [container],
    }
    if claims:
        spec["resourceClaims"] = [_claim(n, t) for n, t in claims]
        container["resources"] = {"claims": [{"name": n} for n, _ in claims]}
    if limits:
        container.setdefault("resources", {})["limits"] = limits
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name}, "spec": spec}


def _claim(name: str, source: str) -> dict[str, str]:
    """``claim:<name>``: an existing ResourceClaim (pods naming it share it), else a template."""
    if source.startswith("claim:"):
        return {"name": name, "resourceClaimName": source[len("claim:") :]}
    return {"name": name, "resourceClaimTemplateName": source}


def run(cluster: Cluster, doc: dict[str, Any], timeout: float = 120) -> dict[str, Any]:
    """Apply the pod, wait until its probe ran, and return what it saw (``phase``, ``uid``)."""
    name = doc["metadata"]["name"]
    cluster.wait_for("the default ServiceAccount", lambda: cluster.kubectl(
        "get", "serviceaccount", "default", check=False).returncode == 0, 60)  # fmt: skip

    def probed() -> str:
        phase = cluster.pod_phase(name)
        if phase == "Running":
            out = cluster.kubectl("logs", name, check=False).stdout
            return out if "--- end" in out else ""
        return f"pod {name} {phase}" if phase in DONE else ""

    cluster.apply(doc)
    try:
        logs = cluster.wait_for(f"pod {name} ran its probe", probed, timeout)
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{cluster.events(name)}") from None
    seen = testbed.parse_probe(logs)
    seen.update(phase=cluster.pod_phase(name), uid=cluster.pod_uid(name), name=name)
    return seen


def stuck(cluster: Cluster, doc: dict[str, Any], reason: str, timeout: float = 90) -> str:
    """Apply the pod and wait until an event of its says ``reason``; returns the events."""
    name = doc["metadata"]["name"]
    cluster.apply(doc)
    return str(cluster.wait_for(
        f"pod {name}: {reason}", lambda: reason in cluster.events(name) and cluster.events(name),
        timeout,
    ))  # fmt: skip


def delete(cluster: Cluster, *names: str) -> None:
    for name in names:
        cluster.kubectl("delete", "pod", name, "--wait=false", "--ignore-not-found", check=False)
    for name in names:
        cluster.wait_for(f"pod {name} gone", lambda n=name: not cluster.pod_phase(n), 120)


def dumps(doc: Any) -> str:
    return json.dumps(doc, indent=1)
