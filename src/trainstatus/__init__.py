"""trainstatus: a training status file kept on disk the moment it changes.

``StatusStore`` holds one JSON document (category -> key -> value, plus metadata) in the layout of
ML-Agents' ``run_logs/training_status.json`` and rewrites it atomically and durably, under a lock,
on every change. ``GlobalTrainingStatus``, ``StatusType`` and ``StatusMetaData`` are drop-ins for
ML-Agents' classes of the same names. ``CheckpointList`` keeps a behavior's checkpoint list so
that it never names a file that is gone.
"""

from ._checkpoints import CheckpointList
from ._errors import (
    TrainingStatusCheckpointError,
    TrainingStatusCheckpointWarning,
    TrainingStatusConflictError,
    TrainingStatusCorruptError,
    TrainingStatusCorruptWarning,
    TrainingStatusError,
    TrainingStatusHistoryWarning,
    TrainingStatusLockTimeout,
    TrainingStatusMissingWarning,
    TrainingStatusReadError,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    TrainingStatusVersionError,
    TrainingStatusVersionWarning,
    TrainingStatusWarning,
    TrainingStatusWriteError,
)
from ._load import STATUS_FORMAT_VERSION
from ._mlagents import GlobalTrainingStatus, StatusMetaData, StatusType
from ._store import StatusStore
from ._version import __version__

__all__ = [
    "STATUS_FORMAT_VERSION",
    "CheckpointList",
    "GlobalTrainingStatus",
    "StatusMetaData",
    "StatusStore",
    "StatusType",
    "TrainingStatusCheckpointError",
    "TrainingStatusCheckpointWarning",
    "TrainingStatusConflictError",
    "TrainingStatusCorruptError",
    "TrainingStatusCorruptWarning",
    "TrainingStatusError",
    "TrainingStatusHistoryWarning",
    "TrainingStatusLockTimeout",
    "TrainingStatusMissingWarning",
    "TrainingStatusReadError",
    "TrainingStatusTypeError",
    "TrainingStatusValueError",
    "TrainingStatusVersionError",
    "TrainingStatusVersionWarning",
    "TrainingStatusWarning",
    "TrainingStatusWriteError",
    "__version__",
]
