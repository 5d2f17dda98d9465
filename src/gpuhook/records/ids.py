"""Container ids as file names: the decision record's link and the exec-env marker are named
after the id, so an id runc would refuse never becomes a path."""

_ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+-.")


def valid_id(container_id: str) -> bool:
    """runc's rule for container ids (``^[\\w+-.]+$``), minus the names ``.`` and ``..``."""
    return (
        bool(container_id)
        and container_id not in (".", "..")
        and len(container_id) <= 1024
        and all(c in _ID_CHARS for c in container_id)
    )
