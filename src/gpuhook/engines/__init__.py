"""Container engine registration: docker, containerd (and room for more engines).

Owns: the pure config edits (:mod:`.registration`), the file side of ``gpuhook runtime
configure|unconfigure`` (:mod:`.configure`), the read-only views that doctor and the maintainer
scripts use (:mod:`.readers`) and the Debian maintainer-script checks (:mod:`.maintscript`).

May import: gpuhook.model, the top-level modules.
"""
