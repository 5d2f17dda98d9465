"""CUDA MPS control daemons (I/O): start, stop, status (:mod:`.daemons`).

The pure part (share groups, limits) is :mod:`gpuhook.pipeline.sharing`.

May import: gpuhook.pipeline, gpuhook.inventory, gpuhook.model, the top-level modules.
"""
