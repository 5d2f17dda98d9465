"""The node inventory, off the hot path: NVML (:mod:`.nvml`, the only pynvml import), the
driver-root scan (:mod:`.driverroot`, :mod:`.ldcache`, :mod:`.elf`, the graphics loader files
:mod:`.loaders`), the capability catalog (:mod:`.catalog`), the inventory file (:mod:`.store`)
and the ``/dev/char`` links of the device nodes (:mod:`.devchar`). Its CDI export is
:mod:`gpuhook.engines.cdi` (it builds its edits with the pipeline's own functions).

May import: gpuhook.config, gpuhook.model, the top-level modules.
"""
