"""The node view: which container holds and uses which GPU (``gpuhook inspect node --usage``)
and the Prometheus metrics (``gpuhook metrics serve``).

:mod:`~gpuhook.nodeview.join` is the pure join of the decision records, NVML's running processes
and each process's owner; :mod:`~gpuhook.nodeview.probe` reads them (records, NVML, /proc);
:mod:`~gpuhook.nodeview.table` prints the view; :mod:`~gpuhook.nodeview.metrics` exposes it
and the records' create counts and timings. Never imported on the container-create path.

May import: gpuhook.records, gpuhook.inventory, gpuhook.mps, gpuhook.pipeline, gpuhook.runtime,
gpuhook.config, gpuhook.model, the top-level modules.
"""
