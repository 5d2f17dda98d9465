"""Decision records: one JSON file per create, and finding them again.

Owns: building and writing records (:mod:`.writer`, the one record writer), lookup by id or
prefix, listing and gc (:mod:`.lookup`), the exec-env markers of containers whose grant carries
environment (:mod:`.execenv`).

May import: gpuhook.pipeline, gpuhook.model, the top-level modules.
"""
