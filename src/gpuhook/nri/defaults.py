"""The plugin's names and defaults, without the NRI messages (the CLI's help needs no
protobuf)."""

from __future__ import annotations

SOCKET = "/var/run/nri/nri.sock"  # containerd's and CRI-O's default NRI socket
NAME = "gpuhook"  # the plugin's name: NRI's validator requires it by this name
INDEX = "10"  # plugins are called in ascending index order


def check_index(index: str) -> str:
    """NRI's rule for a plugin index: exactly two digits. Raises ValueError."""
    if len(index) != 2 or not index.isdigit() or not index.isascii():
        raise ValueError(f"the NRI plugin index must be two digits, not {index!r}")
    return index
