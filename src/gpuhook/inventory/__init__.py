"""The node inventory, off the hot path: NVML (:mod:`.nvml`, the only pynvml import), the
driver-root scan (:mod:`.driverroot`, :mod:`.ldcache`, :mod:`.elf`), the capability catalog
(:mod:`.catalog`), the inventory file (:mod:`.store`) and its CDI export (:mod:`.cdi`, which
builds its edits with the pipeline's own pure functions so that a rule has one owner).

May import: gpuhook.model, gpuhook.pipeline.inject, gpuhook.pipeline.request (pure), the
top-level modules.
"""
