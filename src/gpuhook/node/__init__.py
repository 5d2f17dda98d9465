"""The node installer: ``gpuhook node install|uninstall``, the DaemonSet's entrypoint.

Owns: the self-contained runtime copied from the image onto a node under ``/opt/gpuhook`` (its own
interpreter, standard library, packages, dynamic loader and shared libraries, started through
that loader: :mod:`.bundle`), the install and uninstall steps and their record on the node
(:mod:`.install`), and what runs on the host side (chroot into the host root, the engine's
restart through PID 1's namespaces: :mod:`.host`).

May import: gpuhook.engines, gpuhook.inventory, gpuhook.config, gpuhook.model, gpuhook.runtime
(the dispatcher's relocation), the top-level modules.
"""
