"""gpuhook as an NRI plugin (``gpuhook nri``): the front end for engines that run NRI, the Node
Resource Interface (containerd 2.x, CRI-O), beside the runtime shim.

The engine builds each container's spec (CDI and DRA devices included), then asks its NRI
plugins for adjustments before the runtime runs. gpuhook's plugin turns NRI's pod and container
into the raw spec the shim parses (:mod:`.translate`), decides through the shim's own core
(:func:`gpuhook.pipeline.flow.run` with :mod:`gpuhook.runtime.decide`'s sources) and answers
with the difference between that spec and the core's new one as an NRI container adjustment, or
refuses the create with one line.

Owns: the NRI wire (:mod:`.wire`: the multiplexed unix socket, ttrpc framing; the messages:
``proto/*.proto``, generated into ``*_pb2.py`` by ``scripts/gen-nri-proto``), the plugin's
lifecycle (:mod:`.plugin`: registration, Configure, Synchronize, creates, reconnection) and
its decision records (:mod:`.state`).

May import: gpuhook.pipeline, gpuhook.runtime.decide, gpuhook.records, gpuhook.mps, gpuhook.config,
gpuhook.model, the top-level modules.
"""
