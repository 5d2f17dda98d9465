"""``gpuhook selftest``: prove a node works end to end with real containers.

It makes a throwaway OCI bundle from the host's own files (:mod:`.rootfs`, :mod:`.bundle`), runs
containers through the installed ``gpuhook-runtime`` as an engine does (create, start, wait,
delete, under a private runc ``--root``: :mod:`.lifecycle`), judges what each one saw
(:mod:`.checks`, :mod:`.mps_check`; the optional CUDA program: :mod:`.cuda`) and removes
everything it made (:mod:`.session`). :mod:`.run` runs it start to end; :mod:`.report` holds
the result lines and renders them.

Owns: the self test and its report. Cold CLI code: never imported on the container-create path.

May import: gpuhook.cli.render, gpuhook.records, gpuhook.runtime, gpuhook.inventory, gpuhook.node,
gpuhook.pipeline, gpuhook.config, gpuhook.model, the top-level modules.
"""
