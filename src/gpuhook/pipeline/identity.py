"""Who a container is (pure): its Kubernetes identity, or None for a non-Kubernetes container.

Two witnesses, each written by something a pod author does not control:

- the identity annotations of the engine: containerd's CRI plugin (``io.kubernetes.cri.*``) or
  CRI-O (``io.kubernetes.cri-o.ContainerType`` and the kubelet's labels ``io.kubernetes.pod.*``,
  ``io.kubernetes.container.name``, which CRI-O copies into the spec). The two key sets are never
  mixed. CRI-O also copies the pod's annotations and labels into the spec, after its own keys,
  and lists them in ``io.kubernetes.cri-o.Annotations`` / ``io.kubernetes.cri-o.Labels`` (JSON
  objects): an identity key found there may be the pod author's, so the identity is not trusted.
- the kubelet's own per-pod mounts, in every pod container whatever the engine (cri-dockerd and
  dockershim write no annotation at all): ``<kubelet_dir>/pods/<uid>/etc-hosts`` (``/etc/hosts``)
  and ``<kubelet_dir>/pods/<uid>/containers/<name>/<id>`` (the termination-message file).

Witnesses that disagree, a container type that is missing or unknown, or copied identity keys
give an identity with a ``problem``: the policy treats it as a pod sandbox (no GPU). A container
of a ``podman pod`` carries a few of CRI-O's keys but is no Kubernetes container
(:func:`is_podman_pod_container`).

Also who the container's process is on the host (:func:`client_of`): its uid and groups mapped
through the spec's user namespace, as a CUDA MPS control daemon sees its clients.
"""

from __future__ import annotations

import os

from gpuhook.model.decision import KubeIdentity
from gpuhook.model.frozen import Frozen

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Mapping
    from typing import Any

CONTAINER = "container"
SANDBOX = "sandbox"
UNKNOWN = "unknown"

CONTAINERD = "containerd"
CRIO = "cri-o"
MOUNTS = "kubelet mounts"

# The identity annotations of each engine (role -> key). containerd: pkg/cri/annotations;
# CRI-O: its ContainerType annotation plus the kubelet's labels, which CRI-O copies.
ENGINE_KEYS = {
    CONTAINERD: {
        "type": "io.kubernetes.cri.container-type",
        "uid": "io.kubernetes.cri.sandbox-uid",
        "namespace": "io.kubernetes.cri.sandbox-namespace",
        "pod": "io.kubernetes.cri.sandbox-name",
        "container": "io.kubernetes.cri.container-name",
    },
    CRIO: {
        "type": "io.kubernetes.cri-o.ContainerType",
        "uid": "io.kubernetes.pod.uid",
        "namespace": "io.kubernetes.pod.namespace",
        "pod": "io.kubernetes.pod.name",
        "container": "io.kubernetes.container.name",
    },
}
# What podman 4.x writes into every container of a `podman pod` (seen with podman 4.3: `podman
# pod create`, `podman run --pod`); its infra container gets none of the type keys.
KUBERNETES_PREFIX = "io.kubernetes."
PODMAN_KEYS = frozenset(
    (
        "io.kubernetes.cri-o.ContainerType",
        "io.kubernetes.cri-o.SandboxID",
        "io.kubernetes.cri-o.Created",
        "io.kubernetes.cri-o.TTY",
    )
)
CRIO_COPIED_ANNOTATIONS = "io.kubernetes.cri-o.Annotations"
CRIO_COPIED_LABELS = "io.kubernetes.cri-o.Labels"
# Labels the kubelet sets itself over any pod label of the same name (so their values are its).
KUBELET_LABELS = frozenset(
    (
        "io.kubernetes.pod.uid",
        "io.kubernetes.pod.name",
        "io.kubernetes.pod.namespace",
        "io.kubernetes.container.name",
    )
)


def identify(annotations: dict[str, str], mounts: Any, kubelet_dir: str) -> KubeIdentity | None:
    """The container's Kubernetes identity from both witnesses; None when neither shows one."""
    by_annotations = from_annotations(annotations)
    by_mounts = from_mounts(mounts, kubelet_dir)
    if by_annotations is None or by_annotations.problem:
        return by_annotations or by_mounts
    if by_mounts is None:
        return by_annotations
    return _agree(by_annotations, by_mounts)


def from_annotations(annotations: dict[str, str]) -> KubeIdentity | None:
    if is_podman_pod_container(annotations):
        return None
    engines = [e for e, keys in ENGINE_KEYS.items() if any(k in annotations for k in keys.values())]
    if not engines:
        return None
    if len(engines) > 1:
        return _untrusted(
            "the spec mixes containerd's (io.kubernetes.cri.*) and CRI-O's "
            "(io.kubernetes.cri-o.*, io.kubernetes.pod.*) identity annotations",
            CONTAINERD + "+" + CRIO,
        )
    engine = engines[0]
    keys = ENGINE_KEYS[engine]
    problem = _copied_identity_key(annotations) if engine == CRIO else ""
    ctype = annotations.get(keys["type"], "")
    if not problem and ctype not in (CONTAINER, SANDBOX):
        shown = f"{ctype!r} is unknown" if ctype else "is missing"
        problem = f"the container type ({keys['type']}) {shown}"
    return KubeIdentity(
        pod_uid=annotations.get(keys["uid"], ""),
        namespace=annotations.get(keys["namespace"], ""),
        pod_name=annotations.get(keys["pod"], ""),
        container_name=annotations.get(keys["container"], ""),
        container_type=UNKNOWN if problem else ctype,
        source=engine,
        problem=problem,
    )


def is_podman_pod_container(annotations: dict[str, str]) -> bool:
    """A container of a ``podman pod``: podman writes CRI-O's container type ``container`` and a
    few more ``io.kubernetes.cri-o.*`` keys (:data:`PODMAN_KEYS`), but none of CRI-O's identity
    keys, which CRI-O always writes (the kubelet's labels, its lists of copied annotations and
    labels). Any other ``io.kubernetes.*`` key, or a sandbox type, is CRI-O's to judge."""
    if annotations.get(ENGINE_KEYS[CRIO]["type"]) != CONTAINER:
        return False
    return all(k in PODMAN_KEYS for k in annotations if k.startswith(KUBERNETES_PREFIX))


def from_mounts(mounts: Any, kubelet_dir: str) -> KubeIdentity | None:
    """The pod UID (and container name) of the kubelet's per-pod mounts; None when there are
    none. Mounts that name more than one pod or container give an identity with a problem."""
    pods = os.path.join(os.path.normpath(kubelet_dir), "pods") + "/"
    uids: list[str] = []
    names: list[str] = []
    for mount in mounts if isinstance(mounts, list) else ():
        source = mount.get("source") if isinstance(mount, dict) else None
        if not isinstance(source, str) or not source.startswith("/"):
            continue
        parts = os.path.normpath(source)[len(pods) :].split("/")
        if not os.path.normpath(source).startswith(pods) or not parts[0]:
            continue
        if len(parts) == 2 and parts[1] == "etc-hosts":
            uids.append(parts[0])
        elif len(parts) == 4 and parts[1] == "containers":
            uids.append(parts[0])
            names.append(parts[2])
    if not uids:
        return None
    if len(set(uids)) > 1 or len(set(names)) > 1:
        return _untrusted(
            f"the kubelet's per-pod mounts name more than one pod or container "
            f"(pods {', '.join(sorted(set(uids)))}; containers {', '.join(sorted(set(names)))})",
            MOUNTS,
        )
    return KubeIdentity(uids[0], "", "", names[0] if names else "", CONTAINER, MOUNTS)


def _agree(annotated: KubeIdentity, mounted: KubeIdentity) -> KubeIdentity:
    """The annotated identity, given a problem when the kubelet's mounts contradict it."""
    if mounted.problem:
        problem = mounted.problem
    elif mounted.pod_uid != annotated.pod_uid:
        problem = (
            f"the {annotated.source} annotations name pod uid {annotated.pod_uid or '(none)'} "
            f"but the kubelet's mounts are those of pod {mounted.pod_uid}"
        )
    elif mounted.container_name and mounted.container_name != annotated.container_name:
        problem = (
            f"the {annotated.source} annotations name container "
            f"{annotated.container_name or '(none)'} but the kubelet's mounts are those of "
            f"container {mounted.container_name}"
        )
    else:
        return annotated
    return annotated.replace(container_type=UNKNOWN, problem=problem)


def _copied_identity_key(annotations: dict[str, str]) -> str:
    """Why CRI-O's identity keys cannot be trusted ("" when they can): one of them is among the
    pod annotations or labels CRI-O copied into the spec, or those lists are unreadable."""
    if CRIO_COPIED_ANNOTATIONS not in annotations:
        return f"CRI-O's list of copied annotations ({CRIO_COPIED_ANNOTATIONS}) is missing"
    for key, exempt in (
        (CRIO_COPIED_ANNOTATIONS, frozenset()),
        (CRIO_COPIED_LABELS, KUBELET_LABELS),
    ):
        names = _json_object_keys(annotations.get(key, "{}"))
        if names is None:
            return f"{key} is not a JSON object"
        forged = sorted(k for k in ENGINE_KEYS[CRIO].values() if k in names and k not in exempt)
        if forged:
            return f"{forged[0]} was copied from the pod's own annotations or labels ({key})"
    return ""


def _json_object_keys(raw: str) -> list[str] | None:
    from gpuhook import _fastjson

    try:
        doc = _fastjson.loads(raw)
    except ValueError:
        return None
    return [k for k in doc if isinstance(k, str)] if isinstance(doc, dict) else None


def _untrusted(problem: str, source: str) -> KubeIdentity:
    return KubeIdentity("", "", "", "", UNKNOWN, source, problem)


# --- the process's user, as the host sees it ---------------------------------------------------


class Client(Frozen):
    """Who the container's process is to the control daemon: its uid and groups as the host
    sees them (through the spec's user namespace mappings). ``uid`` None: not known (a user
    namespace joined by path, an id outside the mappings)."""

    uid: int | None
    gids: tuple[int, ...] = ()


ROOT_CLIENT = Client(0, (0,))


def client_of(spec: Mapping[str, Any]) -> Client:
    """The container process's uid and groups as the host (and so the control daemon) sees
    them: ``process.user`` mapped through ``linux.uidMappings``/``gidMappings`` when the spec
    has a user namespace."""
    process = _dict(spec.get("process"))
    user = _dict(process.get("user"))
    uid = _id(user.get("uid", 0))
    extra = user.get("additionalGids")
    gids = [_id(user.get("gid", 0)), *(_id(g) for g in (extra if isinstance(extra, list) else []))]
    linux = _dict(spec.get("linux"))
    spaces = linux.get("namespaces")
    if any(isinstance(ns, dict) and ns.get("type") == "user" for ns in _list(spaces)):
        uid = _mapped(uid, linux.get("uidMappings"))
        gids = [_mapped(g, linux.get("gidMappings")) for g in gids]
    return Client(uid, tuple(sorted({g for g in gids if g is not None})))


def _dict(value: Any) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _id(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 0 else None


def _mapped(value: int | None, mappings: Any) -> int | None:
    """An id inside a user namespace -> the host's (None: not mapped, or no mappings given)."""
    if value is None:
        return None
    for m in _list(mappings):
        inside, host, size = (_id(_dict(m).get(k)) for k in _MAP_KEYS)
        if inside is not None and host is not None and size and inside <= value < inside + size:
            return host + value - inside
    return None


_MAP_KEYS = ("containerID", "hostID", "size")
