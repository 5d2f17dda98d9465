"""The decision pipeline (pure): spec -> request -> policy -> devices -> edits -> apply.

Owns: who a container is (:mod:`.identity`), request parsing (:mod:`.request`), trust
(:mod:`.policy`: one trust function per channel), device ids (:mod:`.devices`),
what to inject (:mod:`.inject`; the driver files per capability: :mod:`.driverfiles`; CUDA
forward compatibility: :mod:`.compat`), the edits interpreter (:mod:`.apply`), the MPS plan
(:mod:`.sharing`), the kubelet checkpoint reader (:mod:`.kubelet`) and the one function that runs
them in order (:mod:`.flow`). No file, NVML or process I/O apart from the checkpoint reader: the
inventory, the checkpoint and the MPS state come in as sources (:mod:`gpuhook.runtime.decide`).

May import: gpuhook.model, gpuhook.inventory.catalog (pure data), gpuhook.config.types,
gpuhook.config.units (values, not the config's I/O), the top-level modules.
"""
