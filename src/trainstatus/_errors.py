"""Every error and warning trainstatus raises, and the helper that issues warnings.

One base class each (``TrainingStatusError``, ``TrainingStatusWarning``) so a caller can catch or
filter everything from this library in one line; subclasses for the cases a caller acts on
differently. Where a built-in exception fits, the subclass inherits it too, so code that already
says ``except OSError`` or ``except TimeoutError`` around its saves keeps working.

Errors carry their context as attributes and survive pickling, because trainers run in several
processes and ship exceptions between them (multiprocessing, concurrent.futures).
"""

from __future__ import annotations

import os
import sys
import warnings

TYPE_CHECKING = False  # typing.TYPE_CHECKING, without importing typing (5-10 ms of `import trainstatus`)
if TYPE_CHECKING:
    from typing import Any

__all__ = [
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
    "warn",
]

_CONTEXT = ("path", "category", "key", "found_version", "lock_file", "moved_to")


def _rebuild(cls: type[Any], message: str, context: dict[str, Any]) -> Any:
    return cls(message, **context)


class _Context:
    """Context attributes shared by the error and the warning classes."""

    path: str | None
    category: str | None
    key: str | None
    found_version: str | None
    lock_file: str | None
    moved_to: str | None

    def _set_context(self, given: dict[str, Any]) -> None:
        unknown = set(given) - set(_CONTEXT)
        if unknown:
            raise TypeError(f"unexpected context {sorted(unknown)}")
        for name in _CONTEXT:
            value = given.get(name)
            if isinstance(value, os.PathLike):
                value = os.fspath(value)
            setattr(self, name, value)

    def _context(self) -> dict[str, Any]:
        return {n: getattr(self, n) for n in _CONTEXT if getattr(self, n) is not None}

    def __reduce__(self) -> tuple[Any, ...]:
        # The default reduce of an exception re-calls the class with ``args`` only, which drops
        # keyword-only context and, for the OSError subclasses, would rebuild a different message.
        return (_rebuild, (type(self), str(self), self._context()))


class TrainingStatusError(_Context, Exception):
    """Base class of every error trainstatus raises.

    Attributes (``None`` where they do not apply): ``path`` of the status file, ``category`` and
    ``key`` concerned, ``found_version`` of a file's format, ``lock_file`` that could not be taken,
    ``moved_to`` where a damaged file was kept.
    """

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self._set_context(context)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class TrainingStatusReadError(TrainingStatusError, OSError):
    """The status file exists but cannot be read (permissions, a directory in its place, I/O error).

    The file is left exactly as it is. The underlying ``OSError`` is the ``__cause__``.
    """

    def __init__(self, message: str, **context: Any) -> None:
        OSError.__init__(self, message)
        self._set_context(context)


class TrainingStatusWriteError(TrainingStatusError, OSError):
    """A write failed. The file on disk and the store's memory are as they were before the call.

    The underlying ``OSError`` (disk full, I/O error, read-only filesystem...) is the ``__cause__``
    and its ``errno`` is copied here.
    """

    def __init__(self, message: str, *, errno: int | None = None, **context: Any) -> None:
        OSError.__init__(self, message)
        self.errno = errno
        self._set_context(context)

    def __reduce__(self) -> tuple[Any, ...]:
        context = self._context()
        context["errno"] = self.errno
        return (_rebuild, (type(self), str(self), context))


class TrainingStatusLockTimeout(TrainingStatusError, TimeoutError):
    """The lock beside the status file (``lock_file``) could not be taken in time."""

    def __init__(self, message: str, **context: Any) -> None:
        OSError.__init__(self, message)
        self._set_context(context)


class TrainingStatusUnfinishedWrite(TrainingStatusLockTimeout):
    """A ``set`` handed its change to another process's write, which has not finished in time.

    A process that holds the lock takes the changes of processes waiting for it into its own
    write. When this call's ``lock_timeout`` ran out, that write was under way and had not
    finished 10 s later (its process stopped, its disk hung): the change may or may not be in the
    file. A ``TrainingStatusLockTimeout`` (so a ``TimeoutError``) for code that catches timeouts
    and retries; unlike the others, it does not promise that nothing was written. ``lock_file``
    is the lock that process holds.
    """


class TrainingStatusConflictError(TrainingStatusError, TimeoutError):
    """Other writers kept changing a status object (``s3://``) that has no lock.

    Raised when a conditional write lost to other writers until ``lock_timeout`` ran out, or when a
    transaction's body read a key (``category``/``key``) that another writer changed before the
    transaction could be written. Nothing of the call was written. On a local file only in that
    second case, and only for a transaction that began with no file, when a writer that got in
    through a lock file deleted by hand made the file meanwhile.
    """

    def __init__(self, message: str, **context: Any) -> None:
        OSError.__init__(self, message)
        self._set_context(context)


class TrainingStatusBackendError(TrainingStatusError):
    """The object store at ``endpoint`` cannot keep a status safely: it ignores conditional writes.

    Raised by the first write to a server that accepted a write it had to refuse (checked once per
    server and process, on an object of its own beside the status), so concurrent writers would
    silently lose each other's values. Nothing of the call was written. For a status only one
    writer ever writes, ``storage_options={"conditional_writes": "unchecked"}`` skips the check.
    """

    def __init__(self, message: str, *, endpoint: str | None = None, **context: Any) -> None:
        super().__init__(message, **context)
        self.endpoint = endpoint

    def __reduce__(self) -> tuple[Any, ...]:
        context = self._context()
        context["endpoint"] = self.endpoint
        return (_rebuild, (type(self), str(self), context))


class TrainingStatusCorruptError(TrainingStatusError):
    """The status file is damaged and the store was opened with ``strict=True``.

    Nothing was moved or changed; without ``strict`` the file is kept aside and a
    ``TrainingStatusCorruptWarning`` is issued instead.
    """


class TrainingStatusVersionError(TrainingStatusError):
    """Writing would replace a file of a newer format (``found_version``) this version cannot keep."""


class TrainingStatusTypeError(TrainingStatusError, TypeError):
    """A value, key or category of a type that cannot be stored. Nothing was written."""


class TrainingStatusValueError(TrainingStatusError, ValueError):
    """A value that cannot be stored faithfully, or a reserved name. Nothing was written."""


class TrainingStatusDependencyError(TrainingStatusError, ImportError):
    """An optional dependency is not installed: boto3, google-cloud-storage or azure-storage-blob,
    for an ``s3://``, ``gs://`` or ``az://`` store. The message names the extra that installs it
    (``pip install "trainstatus[gcs]"``); the ``ImportError`` is the ``__cause__``."""

    def __init__(self, message: str, **context: Any) -> None:
        ImportError.__init__(self, message)
        self._set_context(context)


class TrainingStatusCheckpointError(TrainingStatusError, OSError):
    """A checkpoint file given to ``CheckpointList.add`` or ``set_final`` is missing, is not a
    regular file, or could not be synced to disk. Nothing was recorded and no file was removed.
    Also raised by ``trainer.train(resume_from_checkpoint=True)`` in a Trainer holding
    ``TrainStatusCallback`` when no checkpoint of ``output_dir`` is whole, before anything is loaded.

    ``file_path`` is the file as given; ``errno`` is the underlying error's (``ENOENT`` for a
    missing file), which is the ``__cause__`` when there is one.
    """

    def __init__(self, message: str, *, file_path: str | None = None, errno: int | None = None,
                 **context: Any) -> None:
        OSError.__init__(self, message)
        self.errno = errno
        self.file_path = file_path
        self._set_context(context)

    def __reduce__(self) -> tuple[Any, ...]:
        context = self._context()
        context["errno"] = self.errno
        context["file_path"] = self.file_path
        return (_rebuild, (type(self), str(self), context))


class TrainingStatusCheckpointNotShared(TrainingStatusCheckpointError):
    """The ranks of a process group do not see the same checkpoint files (node-local output folders,
    a share not mounted on every node), so the checkpoint cannot be recorded or resumed from.

    Raised on every rank alike, by a record (nothing recorded) or a resume decision (nothing
    chosen). ``ranks`` are those that see other files than rank 0 (or none), ``hosts`` their hosts.
    """

    def __init__(self, message: str, *, ranks: list[int] | None = None, hosts: list[str] | None = None,
                 file_path: str | None = None, errno: int | None = None, **context: Any) -> None:
        super().__init__(message, file_path=file_path, errno=errno, **context)
        self.ranks = list(ranks or [])
        self.hosts = list(hosts or [])

    def __reduce__(self) -> tuple[Any, ...]:
        context = self._context()
        context.update(errno=self.errno, file_path=self.file_path, ranks=self.ranks, hosts=self.hosts)
        return (_rebuild, (type(self), str(self), context))


class TrainingStatusCollectiveError(TrainingStatusError, TimeoutError):
    """A collective of a record or a resume decision under ``torch.distributed`` failed: a rank did
    not answer within the timeout (it stopped, or is stuck in its save). The message names the
    rank(s) that did not answer as far as this rank can tell; ``rank`` is this process's rank.
    Nothing more was recorded or chosen by this rank.
    """

    def __init__(self, message: str, *, rank: int | None = None, **context: Any) -> None:
        OSError.__init__(self, message)
        self.rank = rank
        self._set_context(context)

    def __reduce__(self) -> tuple[Any, ...]:
        context = self._context()
        context["rank"] = self.rank
        return (_rebuild, (type(self), str(self), context))


class TrainingStatusInUseError(TrainingStatusError):
    """Another job is training on this status file: it holds the run lease ``lock_file``
    (``<status file>.run``) beside it. ``holder`` is what that job wrote there (``pid``, ``host``,
    ``started``, ``run``, ``program``; {} when it could not be read). Nothing was trained or written.
    """

    def __init__(self, message: str, *, holder: dict[str, Any] | None = None, **context: Any) -> None:
        super().__init__(message, **context)
        self.holder = dict(holder or {})

    def __reduce__(self) -> tuple[Any, ...]:
        context = self._context()
        context["holder"] = self.holder
        return (_rebuild, (type(self), str(self), context))


class TrainingStatusWarning(_Context, UserWarning):
    """Base class of every warning trainstatus issues; filter them all with this class."""

    def __init__(self, message: str, **context: Any) -> None:
        super().__init__(message)
        self._set_context(context)

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class TrainingStatusMissingWarning(TrainingStatusWarning):
    """A resume was requested but there is no status file: training restarts from scratch."""


class TrainingStatusVersionWarning(TrainingStatusWarning):
    """The file's format version or a registered metadata field differs, or metadata is missing."""


class TrainingStatusCorruptWarning(TrainingStatusWarning):
    """The status file was damaged; it was moved aside to ``moved_to`` and the store started from
    the newest intact version in its history, or empty when there was none."""


class TrainingStatusHistoryWarning(TrainingStatusWarning):
    """A version a write replaced could not be kept in the history; the write itself succeeded."""


class TrainingStatusCheckpointWarning(TrainingStatusWarning):
    """Checkpoints were skipped because their files are missing or failed the caller's check
    (``CheckpointList.latest``, ``final``), or the files of dropped checkpoints could not be removed.

    ``skipped`` lists ``(entry, reason)`` pairs, newest first for ``latest``.
    """

    def __init__(self, message: str, *, skipped: list[tuple[Any, str]] | None = None, **context: Any) -> None:
        super().__init__(message, **context)
        self.skipped = list(skipped or [])

    def __reduce__(self) -> tuple[Any, ...]:
        context = self._context()
        context["skipped"] = self.skipped
        return (_rebuild, (type(self), str(self), context))


_PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
_INTEGRATIONS_DIR = os.path.join(_PACKAGE_DIR, "integrations")

# The training libraries whose machinery runs an integration (trainstatus.integrations): a warning
# it issues from inside ``trainer.train()``, ``trainer.fit()`` or ``model.learn()`` points past
# their frames, at that call in the user's code.
_LIBRARIES = frozenset({"accelerate", "lightning", "lightning_fabric", "pytorch_lightning", "stable_baselines3",
                        "torch", "transformers"})


def _ours(filename: str) -> bool:
    path = os.path.abspath(filename)
    # The package's modules, those of its private subpackages (_cli/, _storage/, ...), and the
    # integrations with theirs (integrations/_ranks/, ...).
    if path.startswith(_PACKAGE_DIR + os.sep):
        return True
    # contextlib's frames sit between a ``with store.transaction():`` block and our code (a
    # warning is issued from a store, which imported contextlib long before).
    source = getattr(sys.modules.get("contextlib"), "__file__", None)
    return source is not None and path == os.path.abspath(source)


def _library(frame: Any) -> bool:
    name = frame.f_globals.get("__name__")
    return isinstance(name, str) and name.partition(".")[0] in _LIBRARIES


def warn(warning: TrainingStatusWarning) -> None:
    """Issue ``warning`` at the first caller outside this package, so it points at user code.

    Issued through an integration, past the training library's frames too (``_LIBRARIES``): at
    the user's ``trainer.train()`` rather than inside Transformers, unless only library frames are
    left (a thread the library started), where it stays at the first frame outside this package.
    """
    level = 2  # warnings.warn's stacklevel 2 is our caller, the frame we start from
    frame = sys._getframe(1)
    integration = False
    while frame is not None and _ours(frame.f_code.co_filename):
        integration = integration or os.path.abspath(frame.f_code.co_filename).startswith(_INTEGRATIONS_DIR + os.sep)
        frame = frame.f_back  # type: ignore[assignment]
        level += 1
    if integration:
        outer, past = frame, level
        while outer is not None and (_library(outer) or _ours(outer.f_code.co_filename)):
            outer = outer.f_back  # type: ignore[assignment]
            past += 1
        if outer is not None:
            level = past
    warnings.warn(warning, stacklevel=level)
