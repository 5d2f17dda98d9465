"""Container ids as file names: the decision record's link and the exec-env marker are named
after the id, so an id runc would refuse never becomes a path."""

ID_CHARS = frozenset("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_+-.")
MAX_LEN = 1024


def valid_id(container_id: str) -> bool:
    """runc's rule for container ids (``^[\\w+-.]+$``), minus the names ``.`` and ``..``."""
    return (
        bool(container_id)
        and container_id not in (".", "..")
        and len(container_id) <= MAX_LEN
        and all(c in ID_CHARS for c in container_id)
    )
