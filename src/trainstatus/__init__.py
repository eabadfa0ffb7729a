"""trainstatus: a training status file kept on disk the moment it changes.

``StatusStore`` holds one JSON document (category -> key -> value, plus metadata) in the layout of
ML-Agents' ``run_logs/training_status.json`` and rewrites it atomically and durably, under a lock,
on every change. ``GlobalTrainingStatus``, ``StatusType`` and ``StatusMetaData`` are drop-ins for
ML-Agents' classes of the same names. ``CheckpointList`` keeps a behavior's checkpoint list so
that it never names a file that is gone.

The store, its codec and orjson are imported when a name that needs them is first used, not by
``import trainstatus`` itself (PEP 562): a program, a plugin entry point or ``trainstatus --help``
that never opens a store does not pay for them (orjson alone takes about 30 ms to import).
"""

from ._errors import (
    TrainingStatusBackendError,
    TrainingStatusCheckpointError,
    TrainingStatusCheckpointNotShared,
    TrainingStatusCheckpointWarning,
    TrainingStatusCollectiveError,
    TrainingStatusConflictError,
    TrainingStatusCorruptError,
    TrainingStatusCorruptWarning,
    TrainingStatusDependencyError,
    TrainingStatusError,
    TrainingStatusHistoryWarning,
    TrainingStatusInUseError,
    TrainingStatusLockTimeout,
    TrainingStatusMissingWarning,
    TrainingStatusReadError,
    TrainingStatusTypeError,
    TrainingStatusUnfinishedWrite,
    TrainingStatusValueError,
    TrainingStatusVersionError,
    TrainingStatusVersionWarning,
    TrainingStatusWarning,
    TrainingStatusWriteError,
)
from ._version import __version__

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from ._checkpoints.checkpoint_list import CheckpointList
    from ._load import STATUS_FORMAT_VERSION
    from ._mlagents.status import GlobalTrainingStatus, StatusMetaData, StatusType
    from ._store import StatusStore

# Where each name imported on first use lives.
_LAZY = {
    "CheckpointList": "._checkpoints.checkpoint_list",
    "STATUS_FORMAT_VERSION": "._load",
    "GlobalTrainingStatus": "._mlagents.status",
    "StatusMetaData": "._mlagents.status",
    "StatusType": "._mlagents.status",
    "StatusStore": "._store",
}


if not TYPE_CHECKING:  # for type checkers the names are imported above

    def __getattr__(name: str) -> object:
        import importlib

        module = _LAZY.get(name)
        if module is None:
            raise AttributeError(f"module 'trainstatus' has no attribute {name!r}")
        value = getattr(importlib.import_module(module, __name__), name)
        globals()[name] = value  # the next lookup is a plain one
        return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_LAZY))


del TYPE_CHECKING

__all__ = [
    "STATUS_FORMAT_VERSION",
    "CheckpointList",
    "GlobalTrainingStatus",
    "StatusMetaData",
    "StatusStore",
    "StatusType",
    "TrainingStatusBackendError",
    "TrainingStatusCheckpointError",
    "TrainingStatusCheckpointNotShared",
    "TrainingStatusCheckpointWarning",
    "TrainingStatusCollectiveError",
    "TrainingStatusConflictError",
    "TrainingStatusCorruptError",
    "TrainingStatusCorruptWarning",
    "TrainingStatusDependencyError",
    "TrainingStatusError",
    "TrainingStatusHistoryWarning",
    "TrainingStatusInUseError",
    "TrainingStatusLockTimeout",
    "TrainingStatusMissingWarning",
    "TrainingStatusReadError",
    "TrainingStatusTypeError",
    "TrainingStatusUnfinishedWrite",
    "TrainingStatusValueError",
    "TrainingStatusVersionError",
    "TrainingStatusVersionWarning",
    "TrainingStatusWarning",
    "TrainingStatusWriteError",
    "__version__",
]
