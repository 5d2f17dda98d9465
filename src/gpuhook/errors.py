"""Exception types and the one map from an exception to an exit code and a one-line message.

Every executable (the runtime shim, the hooks, the CLI) reports failures through
:func:`describe`, so an operator sees the same single line wherever a failure surfaces.
Stdlib-free: imported on the hot path.
"""

from __future__ import annotations

# Exit codes. 2 follows the shell/click convention for "bad usage or bad configuration".
EXIT_FAILURE = 1
EXIT_CONFIG = 2
EXIT_UNEXPECTED_USERS = 3  # gpuhook inspect node --usage: a GPU has an unexpected user
EXIT_INTERNAL = 70  # EX_SOFTWARE from sysexits.h: a bug in gpuhook, not in its input
EXIT_INTERRUPTED = 130


class GpuhookError(Exception):
    """Base of every error gpuhook reports on purpose. ``str(err)`` is the one-line message."""

    exit_code = EXIT_FAILURE

    def __str__(self) -> str:
        text = super().__str__()
        # One line, always: collapse any newline a wrapped message might carry.
        return " ".join(text.split())


class ConfigError(GpuhookError):
    """The gpuhook config file is unreadable, malformed or invalid."""

    exit_code = EXIT_CONFIG

    def __init__(self, path: str, message: str, key_path: str = "") -> None:
        self.path = path
        self.key_path = key_path
        self.message = message
        where = f"{path}: {key_path}: " if key_path else f"{path}: "
        super().__init__(f"invalid config {where}{message}")


class UsageError(GpuhookError):
    """A command line gpuhook cannot act on."""

    exit_code = EXIT_CONFIG


class SpecError(GpuhookError):
    """The OCI bundle or its config.json is missing, unreadable, malformed or not writable."""


class RequestError(GpuhookError):
    """A container's GPU request is malformed or names something this node does not have."""


class InventoryError(GpuhookError):
    """The node inventory could not be built or read."""


class NvmlNotFoundError(InventoryError):
    """No NVML library could be loaded."""


class CheckpointError(GpuhookError):
    """The kubelet device checkpoint is unreadable or malformed."""


class MpsError(GpuhookError):
    """An MPS control daemon is not in the state a request needs."""


class RuntimeNotFoundError(GpuhookError):
    """The low-level OCI runtime (runc or crun) could not be found."""


class RegistrationError(GpuhookError):
    """A docker, containerd or podman config could not be read or changed."""


class CdiError(GpuhookError):
    """A CDI spec could not be built, validated or written."""


class NodeInstallError(GpuhookError):
    """``gpuhook node install|uninstall`` could not put gpuhook on the node or take it off."""


class RecordNotFoundError(GpuhookError):
    """No decision record for a container (never created through gpuhook-runtime, or deleted)."""


class AmbiguousIdError(UsageError):
    """A container id prefix that matches more than one decision record."""


class ServiceError(GpuhookError):
    """The runtime service cannot listen, or failed a request it had taken on."""


class ChecksFailedError(GpuhookError):
    """``gpuhook doctor`` found at least one failing check (each already printed with its fix)."""


class UnexpectedUsersError(GpuhookError):
    """``gpuhook inspect node --usage`` found a process on a GPU that gpuhook did not grant it
    (the view is printed in full first)."""

    exit_code = EXIT_UNEXPECTED_USERS


def describe(exc: BaseException) -> tuple[int, str]:
    """Map any exception to ``(exit code, one-line message)``; the only such map in gpuhook."""
    if isinstance(exc, GpuhookError):
        return exc.exit_code, str(exc)
    if isinstance(exc, KeyboardInterrupt):
        return EXIT_INTERRUPTED, "interrupted"
    if isinstance(exc, PermissionError):
        return EXIT_FAILURE, _os_error_line("permission denied", exc)
    if isinstance(exc, FileNotFoundError):
        return EXIT_FAILURE, _os_error_line("not found", exc)
    if isinstance(exc, OSError):
        return EXIT_FAILURE, _os_error_line(exc.strerror or "I/O error", exc)
    text = " ".join(str(exc).split())
    return EXIT_INTERNAL, f"internal error ({type(exc).__name__}): {text}; please report this"


def _os_error_line(what: str, exc: OSError) -> str:
    name = exc.filename if exc.filename is not None else ""
    return f"{what}: {name}" if name else what
