"""CUDA MPS (I/O): the control daemons, start, stop, status (:mod:`.daemons`), and admission:
what is reserved on each shared GPU now and whether a container fits (:mod:`.admission`, on the
create path).

The pure part (share groups, limits) is :mod:`gpuhook.pipeline.sharing`.

May import: gpuhook.pipeline, gpuhook.records, gpuhook.inventory, gpuhook.config, gpuhook.model,
the top-level modules.
"""
