"""Prometheus metrics of the node (``gpuhook metrics serve``), with python3-prometheus-client.

Two sources, neither on a container's create path:

* the decision records every GPU create writes (:mod:`gpuhook.records.writer`): a
  :class:`RecordFeed` reads each record once, when it first sees it (every scan interval and at
  each scrape), and counts it: creates by decision and channel, refusals by reason kind, the
  create latency the record's ``timing`` holds (service or Python path). Counters start at 0
  when the metrics process starts and count the records it then finds; a container created and
  deleted between two scans is not seen.
* at each scrape, one look at the node (:func:`gpuhook.nodeview.probe.snapshot`: the live
  records, NVML's running processes, /proc): MPS reservations and free share per GPU,
  processes and memory per GPU and per pod, unexpected users per GPU, the inventory's age, and
  whether the runtime service answers.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

if TYPE_CHECKING:
    from collections.abc import Iterator

    from prometheus_client.core import Metric

    from gpuhook.config.types import Config
    from gpuhook.model.record import Record
    from gpuhook.nodeview.probe import Snapshot

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


def decision_of(record: Record) -> str:
    """``granted``, ``driver-only``, ``refused`` or ``no-request``."""
    d = record.decision
    if not d.gpu_container:
        return "no-request"
    if d.refused:
        return "refused"
    return "granted" if d.devices else "driver-only"


# The kinds of refusal, by what the deciding reason says (gpuhook.pipeline.policy's wording).
_REFUSAL_KINDS = (
    ("pod sandbox", "sandbox"),
    ("malformed", "malformed"),
    ("names no device", "no-device-named"),
    ("cannot verify", "checkpoint-unreadable"),
    ("no GPU resource is allocated", "not-allocated"),
    ("none of the requested devices is allocated", "not-allocated"),
    ("are ignored", "channel-ignored"),
)


def refusal_kind(why: str) -> str:
    """The kind of a refusal from its reason line (``other`` for one not known here)."""
    return next((kind for text, kind in _REFUSAL_KINDS if text in why), "other")


class RecordFeed:
    """Counts each decision record once: keyed by its link's name and the record file's inode
    and mtime (a new container of an old id, or with the same bundle, is a new record)."""

    def __init__(self, records_dir: str) -> None:
        self.records_dir = records_dir
        self.lock = threading.Lock()
        self.seen: dict[str, tuple[int, int]] = {}
        self.creates = Counter(
            "gpuhook_container_creates",
            "Container creates gpuhook decided (one per decision record seen), by decision, "
            "deciding channel and path (service: the runtime service; python: a Python process)",
            ["decision", "channel", "path"],
            registry=None,
        )
        self.refusals = Counter(
            "gpuhook_container_refusals",
            "GPU requests refused, by the kind of the deciding reason and the channel",
            ["kind", "channel"],
            registry=None,
        )
        self.latency = Histogram(
            "gpuhook_create_decision_seconds",
            "How long gpuhook-runtime took to decide a create (its entry to the record), by path",
            ["path"],
            buckets=LATENCY_BUCKETS,
            registry=None,
        )

    def scan(self) -> int:
        """Count the records not seen yet; returns how many."""
        from gpuhook.records import lookup
        from gpuhook.records.ids import link_id

        with self.lock:
            try:
                names = [n for n in os.listdir(self.records_dir) if link_id(n)]
            except OSError:
                names = []
            current: dict[str, tuple[int, int]] = {}
            counted = 0
            for name in names:
                try:
                    st = os.stat(os.path.join(self.records_dir, name))
                except OSError:
                    continue  # a deleted container's dangling link
                key = (st.st_ino, st.st_mtime_ns)
                current[name] = key
                if self.seen.get(name) == key:
                    continue
                entry = lookup.entry_of(self.records_dir, name)
                if entry.record is not None:
                    self.count(entry.record)
                    counted += 1
            self.seen = current
            return counted

    def count(self, record: Record) -> None:
        decision = decision_of(record)
        channel = record.decision.channel or "none"
        path = record.timing.path if record.timing is not None else "unknown"
        self.creates.labels(decision, channel, path).inc()
        if decision == "refused":
            why = record.decision.reasons[0].why if record.decision.reasons else ""
            self.refusals.labels(refusal_kind(why), channel).inc()
        if record.timing is not None:
            self.latency.labels(record.timing.path).observe(record.timing.seconds)


class NodeCollector(Collector):
    """The gauges of one look at the node, taken at each scrape (after the records' scan)."""

    def __init__(self, config: Config, feed: RecordFeed) -> None:
        self.config = config
        self.feed = feed
        self.lock = threading.Lock()  # one look at a time, however many scrapes come at once

    def collect(self) -> Iterator[Metric]:
        with self.lock:
            families = list(self._collect())
        yield from families

    def _collect(self) -> Iterator[Metric]:
        from gpuhook.inventory import store
        from gpuhook.runtime import service

        self.feed.scan()
        status = store.status(self.config)
        age = GaugeMetricFamily(
            "gpuhook_inventory_age_seconds", "Seconds since the GPU inventory was built"
        )
        fresh = GaugeMetricFamily(
            "gpuhook_inventory_fresh", "1 when the inventory describes the node's driver, else 0"
        )
        age.add_metric([], status.age_s if status.age_s is not None else float("nan"))
        fresh.add_metric([], 1.0 if status.fresh else 0.0)
        yield from (age, fresh)
        up = GaugeMetricFamily(
            "gpuhook_runtime_service_up",
            "1 when the runtime service (gpuhook runtime serve) accepts connections on its "
            "socket, 0 when it does not; no sample when runtime.service is empty",
            labels=["socket"],
        )
        socket = self.config.service_socket
        if socket:
            up.add_metric([socket], 0.0 if service.probe(socket) else 1.0)
        yield up
        if status.inventory is not None:
            from gpuhook.nodeview import probe

            yield from node_families(probe.snapshot(self.config, status.inventory))


def node_families(snap: Snapshot) -> Iterator[Metric]:
    """The families of one snapshot (pure)."""
    yield from _device_families(snap)
    yield from _pod_families(snap)
    yield from _mps_families(snap)
    nvml = GaugeMetricFamily("gpuhook_nvml_up", "1 when NVML's processes could be read, else 0")
    nvml.add_metric([], 0.0 if snap.nvml_error else 1.0)
    yield nvml


def _device_families(snap: Snapshot) -> Iterator[Metric]:
    labels = ["gpu", "uuid"]
    procs = GaugeMetricFamily(
        "gpuhook_gpu_processes", "Processes NVML lists on a GPU or MIG device", labels=labels
    )
    memory = GaugeMetricFamily(
        "gpuhook_gpu_process_memory_bytes",
        "Device memory the processes on a GPU or MIG device hold",
        labels=labels,
    )
    unexpected = GaugeMetricFamily(
        "gpuhook_gpu_unexpected_users",
        "Processes on a GPU or MIG device that gpuhook did not grant it to (a refused or "
        "ungranted container, a container without a record, a host process)",
        labels=labels,
    )
    for d in snap.usage.devices:
        key = [d.device.id, d.device.uuid]
        procs.add_metric(key, float(len({u.pid for u in d.uses})))
        memory.add_metric(key, float(sum(u.used_memory for u in d.uses)))
        unexpected.add_metric(key, float(len({u.pid for u in d.uses if not u.expected})))
    yield from (procs, memory, unexpected)


def _pod_families(snap: Snapshot) -> Iterator[Metric]:
    labels = ["namespace", "pod", "container", "gpu"]
    procs = GaugeMetricFamily(
        "gpuhook_pod_gpu_processes", "Processes of a pod's container on a GPU", labels=labels
    )
    memory = GaugeMetricFamily(
        "gpuhook_pod_gpu_memory_bytes",
        "Device memory a pod's container's processes hold on a GPU",
        labels=labels,
    )
    counts: dict[tuple[str, str, str, str], list[int]] = {}
    for d in snap.usage.devices:
        for u in d.uses:
            if not u.pod:
                continue
            namespace, _, pod = u.pod.partition("/")
            slot = counts.setdefault((namespace, pod, u.container_name, d.device.id), [0, 0])
            slot[0] += 1
            slot[1] += u.used_memory
    for key, (n, used) in sorted(counts.items()):
        procs.add_metric(list(key), float(n))
        memory.add_metric(list(key), float(used))
    yield from (procs, memory)


def _mps_families(snap: Snapshot) -> Iterator[Metric]:
    labels = ["group", "gpu", "uuid"]
    reserved = GaugeMetricFamily(
        "gpuhook_mps_reserved_bytes",
        "Device memory the live MPS client containers of a share group reserve on a GPU",
        labels=labels,
    )
    free = GaugeMetricFamily(
        "gpuhook_mps_free_bytes",
        "A shared GPU's memory no live MPS client container reserves (what admission has left)",
        labels=labels,
    )
    clients = GaugeMetricFamily(
        "gpuhook_mps_client_containers",
        "Live MPS client containers of a share group",
        labels=["group"],
    )
    devices = {d.device.uuid: d.device for d in snap.usage.devices}
    for group, uuids in snap.mps_groups:
        members = [g for g in snap.grants if g.mps_group == group and not g.refused]
        clients.add_metric([group], float(len(members)))
        for uuid in uuids:
            dev = devices.get(uuid)
            if dev is None:
                continue
            held = sum(size for g in members for u, size in g.mps_reserved if u == uuid)
            reserved.add_metric([group, dev.id, uuid], float(held))
            free.add_metric([group, dev.id, uuid], float(max(0, dev.memory_total - held)))
    yield from (reserved, free, clients)


def registry(config: Config) -> tuple[CollectorRegistry, RecordFeed]:
    """A registry with every family (the node collector first: each scrape scans the records
    before the counters are read)."""
    reg = CollectorRegistry(auto_describe=False)
    feed = RecordFeed(config.records_dir)
    reg.register(NodeCollector(config, feed))
    for family in (feed.creates, feed.refusals, feed.latency):
        reg.register(family)
    return reg, feed
