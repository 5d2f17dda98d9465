"""Container ids as file names: the decision record's link and the exec-env marker are named
after the id, so an id runc would refuse never becomes a path."""

import os

SUFFIX = ".json"  # a record link is <records_dir>/<id>.json
# <state_dir>/nri/<id>/: the records of gpuhook's NRI plugin (gpuhook.nri.state), which it
# removes itself when the engine removes the container; gc leaves them to it.
NRI_RECORDS = "nri"
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


def link_path(records_dir: str, container_id: str) -> str:
    """Where the record link of a container lies."""
    return os.path.join(records_dir, container_id + SUFFIX)


def link_id(name: str) -> str:
    """The container id whose record link an entry of the records folder is; "" for another
    file."""
    if name.endswith(SUFFIX) and len(name) > len(SUFFIX):
        return name[: -len(SUFFIX)]
    return ""
