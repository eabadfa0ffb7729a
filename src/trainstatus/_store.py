"""The store: the document in memory, written through to storage on every change.

Memory model. ``_doc`` is the document as this store last read or wrote it (category -> key ->
``Entry``); it is never mutated, only replaced, so ``get`` reads it without a lock and never sees
half of a change. ``_pending`` holds changes not yet written: one key for a plain ``set``, many
inside a transaction. A write, under the lock: if the stored file changed since ``_doc`` was taken
(another process or store wrote it), re-read it into ``_doc``; lay ``_pending`` over it key by key;
write that; make it the new ``_doc``. If the write fails, ``_doc`` still is what is on disk and the
pending change is dropped, so memory always matches the file.

Group commit. A plain ``set`` does not write alone when other threads are setting on the same
store: its change joins the open ``_Batch``. The first thread to find no write in progress leads:
it takes the locks, then the batch (every change queued by then, its own included), writes it once
and hands the outcome to every thread whose change it carried. So each ``set`` still returns only
after a write holding its change is durable, and raises if that write failed. A thread whose change
is still queued when its ``lock_timeout`` runs out takes it back and raises; once taken, a change
is written (the leader holds every lock by then) and its thread waits for the outcome.

Storage without a lock (an ``s3://`` object, ``Storage.conditional``). A write does not ask first
whether the object changed: its conditional ``replace`` fails with ``Conflict`` if it did, and the
store then re-reads, lays ``_pending`` over the new version key by key and tries again after a
jittered, growing pause, until the call's ``lock_timeout`` is spent. Changes to different keys
therefore never lose each other. A transaction's body may have decided on values it read, so a
transaction also remembers which keys its body read (``_tx_reads``); if another writer changed one
of them, retrying the writes alone would be wrong, and the transaction fails with ``_StaleRead``
instead (``run_transaction`` runs the body again).
"""

from __future__ import annotations

import contextlib
import enum
import os
import threading
import time
import weakref
from collections.abc import Callable, Iterator, Mapping
from typing import Any, TypeVar

from . import _history, _interrupts, _locking
from . import _log as logging  # logging.getLogger("trainstatus") without importing logging: see _log
from ._checkpoint_files import CHECKPOINTS, FINAL_CHECKPOINT, describe_missing
from ._codec import Entry, check_name, decode, encode_loaded, encode_value
from ._errors import (
    TrainingStatusConflictError,
    TrainingStatusCorruptError,
    TrainingStatusCorruptWarning,
    TrainingStatusError,
    TrainingStatusLockTimeout,
    TrainingStatusMissingWarning,
    TrainingStatusReadError,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    TrainingStatusVersionError,
    TrainingStatusWriteError,
    warn,
)
from ._location import check_location, is_s3_url
from ._load import METADATA, STATUS_FORMAT_VERSION, Corrupt, Document, check_metadata, is_newer_format, load_document
from ._render import Renderer
from ._storage import Conflict, LocalFile, Storage
from ._version import __version__

__all__ = ["StatusStore"]

logger = logging.getLogger("trainstatus")

_OWN_METADATA = ("stats_format_version", "trainstatus_version")
_OWN_ENTRIES = {  # their entries, the same for every store (entries are immutable)
    "stats_format_version": encode_loaded(STATUS_FORMAT_VERSION),
    "trainstatus_version": encode_loaded(__version__),
}
_live_stores: weakref.WeakSet[StatusStore] = weakref.WeakSet()
# Named for the API reference: run_transaction(func: Callable[[StatusStore], Result]) -> Result.
Result = TypeVar("Result")
_ALL = ("", "")  # in ``_tx_reads``: the body read the whole document (``to_dict``)
# Pause after a lost conditional write: grows from the first to the longest, each jittered
# between half and all of it, so that writers that collided do not collide again in step.
_FIRST_BACKOFF = 0.01
_LONGEST_BACKOFF = 1.0


# How often a store removes temp files of dead writers after another process's write (see _sync).
_CLEANUP_EVERY = 1.0


def _path_option(path: Any) -> str:
    """``path`` as ``open()`` takes it (str, bytes or os.PathLike), as a str."""
    try:
        given = os.fspath(path)
    except TypeError:
        raise TrainingStatusTypeError(
            f"path must be a str, bytes or os.PathLike (pathlib.Path), not {type(path).__name__!r} "
            f"({path!r}); give the status file's path, e.g. 'results/run1/run_logs/training_status.json'.",
        ) from None
    return os.fsdecode(given) if isinstance(given, bytes) else given


_OPTION_TYPES = {bool: "True or False", str: "a str", Mapping: "a dict (a mapping) or None",
                 float: "a number of seconds or None", int: "a number of versions (an int) or None"}
DEFAULT_HISTORY = 20  # versions kept beside a local file (a few KB each)
_CHECKPOINT_KEYS = frozenset({CHECKPOINTS, FINAL_CHECKPOINT})


def _check_option(name: str, value: Any, kind: type, location: str) -> None:
    """Refuse an option of the wrong type, such as a string from a YAML config ("no" for False)."""
    if value is None and kind is Mapping:
        return
    if kind is bool and type(value) is bool:
        return
    if kind is not bool and kind is not float and isinstance(value, kind) and not (kind is int and type(value) is bool):
        return
    hint = ""
    if isinstance(value, str):
        hint = " (options read from a config file arrive as strings: convert them first)"
    raise TrainingStatusTypeError(
        f"StatusStore option {name}= must be {_OPTION_TYPES[kind]}, not {type(value).__name__!r} "
        f"({value!r}), for {location}{hint}.",
        path=location,
    )


_AGAIN = "set the value again"  # what the storage's write errors say to do once the cause is fixed


@contextlib.contextmanager
def _retold(todo: str) -> Iterator[None]:
    """Make a write error say ``todo`` (``delete it again``) where the storage, which does not
    know which call wrote, says to set the value again."""
    try:
        yield
    except TrainingStatusWriteError as exc:
        message = str(exc)
        if _AGAIN not in message:
            raise
        retold = TrainingStatusWriteError(message.replace(_AGAIN, todo), errno=exc.errno, **exc._context())
        retold.__dict__.update({k: v for k, v in vars(exc).items() if k not in vars(retold)})
        raise retold from exc.__cause__


class _NotRestored(Exception):
    """A version of the history could not be written back at open; the message says so."""


class _StaleRead(TrainingStatusConflictError):
    """A transaction's body read a key another writer changed before the transaction was written."""


def _name(value: Any, what: str, location: str) -> str:
    if type(value) is str:
        return value
    if isinstance(value, enum.Enum):
        if isinstance(value.value, str):
            return str(value.value)
        raise TrainingStatusTypeError(
            f"A {what} must be a str or an Enum whose value is a str; the Enum member {value!r} "
            f"has the value {value.value!r} ({type(value.value).__name__}), in {location}. Use its "
            f".name, or an Enum with str values.",
            path=location,
        )
    if isinstance(value, str):
        return str(value)
    raise TrainingStatusTypeError(
        f"A {what} must be a str or an Enum whose value is a str, not {type(value).__name__!r} "
        f"({value!r}), in {location}.",
        path=location,
    )


_Change = tuple[tuple[str, str], Entry]


class _Batch:
    """Changes of several threads' ``set`` calls, written together by one of them (the leader)."""

    __slots__ = ("changes", "done", "error", "taken")

    def __init__(self) -> None:
        self.changes: list[_Change] = []  # in arrival order: a later set of the same key wins
        self.taken = False  # the leader holds the locks and is writing it; no change joins or leaves
        self.done = False
        self.error: BaseException | None = None


def _error_for_waiter(error: BaseException, location: str) -> BaseException:
    """The failure of a group write as raised in a thread whose change it carried, not the leader.

    Each thread gets its own copy (one exception object raised in several threads at once would
    collect all their tracebacks); the leader raises the original.
    """
    if isinstance(error, Exception):
        try:
            import copy  # here: copy (and its imports) for a rare error, not for every start

            twin = copy.copy(error)
        except Exception:  # noqa: BLE001 - an exception class that cannot be copied: described below
            twin = None
        if type(twin) is type(error) and str(twin) == str(error):
            assert twin is not None
            twin.__cause__ = error.__cause__
            twin.__suppress_context__ = error.__suppress_context__
            return twin
    failure = TrainingStatusError(
        f"The write of {location} that carried this change was interrupted in another thread "
        f"({type(error).__name__}); the change may not be in the file. Set it again.",
        path=location,
    )
    failure.__cause__ = error
    return failure


def _apply(document: Mapping[str, dict[str, Entry]], pending: Mapping[tuple[str, str], Entry | None]) -> dict[str, dict[str, Entry]]:
    """``document`` with ``pending`` laid over it, copying only the categories it touches.

    A category whose last key is deleted goes too; one that was empty on disk is left alone.
    """
    result = dict(document)
    touched: dict[str, dict[str, Entry]] = {}
    for (category, key), entry in pending.items():
        entries = touched.get(category)
        if entries is None:
            entries = touched[category] = dict(result.get(category, {}))
            result[category] = entries
        if entry is None:
            entries.pop(key, None)
        else:
            entries[key] = entry
    for category, entries in touched.items():
        if not entries:
            del result[category]
    return result


class _Transaction:
    """What ``StatusStore.transaction()`` returns: a class, not a generator, for ``__enter__``.

    Once the transaction is open the only way out is ``__exit__``, which the with statement calls
    only if ``__enter__`` returned; so no signal may raise between the opening and the return.
    Both frames hold signals back on every line (``_interrupts.BOUNDARIES``); what arrived while
    opening is delivered before returning, and if that raises the transaction is closed first.
    The body runs with signals going through at once: it is the caller's code.
    """

    __slots__ = ("main", "opened", "outer", "savepoint", "stack", "start", "store")

    def __init__(self, store: StatusStore, start: float | None = None) -> None:
        self.store = store
        self.start = start
        self.main = False
        self.opened = False
        self.outer = False
        self.savepoint: tuple[dict[tuple[str, str], Entry | None], bool, bool] = ({}, False, False)
        self.stack = contextlib.ExitStack()

    def __enter__(self) -> StatusStore:
        if self.opened:
            raise TrainingStatusError(
                f"This transaction on {self.store.path} is already open; call store.transaction() "
                "again for a nested one.",
                path=self.store.path,
            )
        self.opened = True
        main = self.main = _interrupts.enter()
        try:
            self.store._begin(self)
        except BaseException:
            if main:
                _interrupts.leave()
            raise
        if not main:
            return self.store
        _interrupts.hold()
        state = _interrupts.state
        while True:
            if not state.pending: state.depth -= 1; state.users -= 1; return self.store  # noqa: E701,E702 - one line: atomic
            try:
                _interrupts.deliver()  # with the transaction open: a handler may just set a flag
            except BaseException:
                _interrupts.unhold()
                try:
                    self.store._end(self, failed=True)
                finally:
                    _interrupts.leave()
                raise

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: object) -> None:
        if self.main: _interrupts.state.depth += 1  # noqa: E701 - the hold counts it as a user already
        try:
            self.store._end(self, failed=exc_type is not None)
        finally:
            if self.main:
                _interrupts.leave()




class StatusStore:
    """A training status file kept on disk the moment it changes.

    ``StatusStore(path)`` opens (or prepares to create) the JSON document at ``path``: category
    (a behavior or environment-parameter name) -> key -> JSON value, plus a ``"metadata"`` block,
    in the layout of ML-Agents' ``training_status.json``. Every ``set`` and ``delete`` rewrites the
    file atomically (temp file, fsync, rename, directory fsync) under a lock before returning.

    Options:

    - ``resume``: the caller is resuming a run, so a missing file is worth a
      ``TrainingStatusMissingWarning``, and the newest intact version in its history (if any) is
      put back in its place. A fresh run (the default) starts empty silently.
    - ``durable``: fsync the file and its directory on each write (the default). ``False`` keeps
      writes atomic (safe when the process is killed) but not safe against power loss.
    - ``lock_timeout``: seconds to wait for the lock before ``TrainingStatusLockTimeout``; ``None``
      waits forever. On ``s3://``, how long a call may keep retrying conditional writes that other
      writers won before ``TrainingStatusConflictError``.
    - ``lock``: how writers of a local file exclude each other. ``"flock"`` (the default) locks
      ``<file>.lock`` with ``flock``: fast, and freed by the kernel when its holder dies, but not
      shared between machines on NFS and similar filesystems. ``"soft"`` holds a lease file,
      ``<file>.softlock``, that works on any filesystem with exclusive create; a killed holder is
      taken over at once on its own machine and after 10 s without renewal from another. Every
      writer of one file must use the same mode.
    - ``metadata``: extra fields for the metadata block (e.g. ``{"torch_version": ...}``); a file
      written with different values of these fields gets a ``TrainingStatusVersionWarning``.
    - ``strict``: raise ``TrainingStatusCorruptError`` on a damaged file instead of keeping it
      aside and putting back the newest intact version from its history (or starting empty when
      there is none).
    - ``allow_downgrade``: let this version rewrite a file of a newer format (dropping its new
      format version); without it such a write raises ``TrainingStatusVersionError``.
    - ``history``: how many earlier versions of a local file to keep beside it, as
      ``.<file>.history-<n>`` (default 20; 0 keeps none). Each write keeps the version it
      replaces (a hard link: no copy, no extra fsync). A damaged file, or a missing one when
      resuming, is replaced by the newest intact version kept, with a warning saying which.
      ``trainstatus history``, ``diff`` and ``restore`` work with them. Not on ``s3://``.
    - ``storage_options``: for an ``s3://bucket/key`` URL given as ``path`` (needs the ``s3``
      extra): ``endpoint_url``, ``key``, ``secret``, ``token``, ``region_name``, ``profile``,
      ``anon``, ``client_kwargs``, ``config_kwargs``, as s3fs names them. Without them boto3's usual
      AWS environment and files apply. Such a store takes no lock: each write is a conditional
      PUT, retried over the new version when another writer got in first.
    """

    @_interrupts.protected
    def __init__(
        self,
        path: str | bytes | os.PathLike[str] | os.PathLike[bytes],
        *,
        resume: bool = False,
        durable: bool = True,
        lock_timeout: float | None = 30.0,
        lock: str = "flock",
        metadata: Mapping[str, Any] | None = None,
        strict: bool = False,
        allow_downgrade: bool = False,
        history: int | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        given = _path_option(path)
        _check_option("resume", resume, bool, given)
        _check_option("durable", durable, bool, given)
        _check_option("strict", strict, bool, given)
        _check_option("allow_downgrade", allow_downgrade, bool, given)
        _check_option("lock", lock, str, given)
        _check_option("metadata", metadata, Mapping, given)
        _check_option("storage_options", storage_options, Mapping, given)
        if history is not None:
            _check_option("history", history, int, given)
            if history < 0:
                raise TrainingStatusValueError(
                    f"StatusStore option history= must be a number of versions >= 0 (0: keep none; None: the "
                    f"default, {DEFAULT_HISTORY}), not {history!r}, for {given}.",
                    path=given,
                )
        if lock_timeout is not None and (type(lock_timeout) is bool or not isinstance(lock_timeout, (int, float))):
            _check_option("lock_timeout", lock_timeout, float, given)
        check_location(given)
        if lock not in _locking.LOCK_MODES:
            raise TrainingStatusValueError(
                f"StatusStore option lock= must be one of {', '.join(map(repr, _locking.LOCK_MODES))}, "
                f"not {lock!r}, for {given}.",
                path=given,
            )
        if lock != "flock" and isinstance(given, str) and is_s3_url(given):
            raise TrainingStatusValueError(
                f"lock={lock!r} is for local paths; {given!r} is an s3:// object, which takes no lock "
                "(writes are conditional). Leave lock= out.",
                path=given,
            )
        storage: Storage
        if isinstance(given, str) and is_s3_url(given):
            if history:
                raise TrainingStatusValueError(
                    f"history={history} is kept for local files only; {given!r} is an s3:// object. "
                    "Turn on versioning in the bucket to keep earlier versions, and leave history= out.",
                    path=given,
                )
            from ._s3 import S3Object  # here: boto3's users only

            storage = S3Object(given, storage_options)
        elif storage_options is not None:
            raise TrainingStatusValueError(
                f"storage_options= is for s3:// URLs; {given!r} is a local path, which takes none. "
                "Leave storage_options out, or give an s3://bucket/key URL.",
                path=given,
            )
        else:
            storage = LocalFile(os.path.abspath(given), durable=durable, lock=lock,
                                history=DEFAULT_HISTORY if history is None else history)
        self._init(storage, resume=resume, lock_timeout=lock_timeout,
                   metadata=metadata, strict=strict, allow_downgrade=allow_downgrade)

    @classmethod
    def _on_storage(cls, storage: Storage, **options: Any) -> StatusStore:
        store = cls.__new__(cls)
        store._init(storage, **options)
        return store

    def _init(
        self,
        storage: Storage,
        *,
        resume: bool = False,
        lock_timeout: float | None = 30.0,
        metadata: Mapping[str, Any] | None = None,
        strict: bool = False,
        allow_downgrade: bool = False,
    ) -> None:
        if lock_timeout is not None and not lock_timeout >= 0:
            raise TrainingStatusValueError(
                f"StatusStore option lock_timeout= must be a number of seconds >= 0 (0: do not wait) or None "
                f"(wait forever), not {lock_timeout!r}, for {storage.location}.",
                path=storage.location,
            )
        if lock_timeout is not None and lock_timeout > threading.TIMEOUT_MAX:
            lock_timeout = None  # longer than the platform can wait for (inf included): forever
        self._storage = storage
        self._location = storage.location
        self._resume = resume
        self._lock_timeout = lock_timeout
        self._strict = strict
        self._allow_downgrade = allow_downgrade
        self._mutex = threading.RLock()
        self._guard_depth = 0  # guarded by _mutex
        self._queue = threading.Lock()  # guards the three below
        self._open_batch: _Batch | None = None  # where a set joins; None until a set opens one
        self._writing = False  # a leader is writing (or waiting for the locks to write)
        # Threads waiting for a group write or for the turn to lead, each on its own taken Lock,
        # released to wake it (what a Condition does, but the wait is a C-level acquire, which
        # an interrupt leaves either taken or not: see _interrupts).
        self._waiters: list[threading.Lock] = []
        self._deadline: float | None = None  # of the outermost guarded call; guarded by _mutex
        self._pending: dict[tuple[str, str], Entry | None] = {}
        self._save_requested = False
        self._cleared = False  # clear() pending: start from an empty document, own metadata only
        self._tx_depth = 0
        self._tx_owner: int | None = None
        self._tx_reads: set[tuple[str, str]] | None = None  # see the module doc; guarded by _mutex
        self._vanished = False  # the last read after opening found no document at all
        self._tx_generation = _locking.generation
        self._forked_in_transaction = False
        self._closed = False
        self._cleaned = False
        self._last_cleanup = -_CLEANUP_EVERY  # when _sync last removed leftovers (monotonic)
        self._own_metadata = self._metadata_entries(metadata or {})
        self._doc: dict[str, dict[str, Entry]] = {}
        self._meta: dict[str, Entry] = {}
        self._renderer = Renderer()  # keeps each category's bytes between writes
        self._newer_format: str | None = None
        self._load(initial=True, locked=False)
        self._clean_leftovers_at_open()
        _live_stores.add(self)

    def _metadata_entries(self, metadata: Mapping[str, Any]) -> dict[str, Entry]:
        entries = dict(_OWN_ENTRIES)
        for field, value in metadata.items():
            name = _name(field, "metadata field", self._location)
            if name in _OWN_METADATA:
                raise TrainingStatusValueError(
                    f"The metadata field {name!r} is written by trainstatus itself and cannot be "
                    f"given for {self._location}; leave it out of metadata=.",
                    path=self._location, category=METADATA, key=name,
                )
            entries[name] = encode_value(value, path=self._location, category=METADATA, key=name)
        return entries

    # -- public API --------------------------------------------------------------------------

    @property
    def path(self) -> str:
        """The absolute path of the status file, as given (a symlink is not resolved here)."""
        return self._location

    def get(self, category: str | enum.Enum, key: str | enum.Enum, /, default: Any = None) -> Any:
        """The value at ``category``/``key``, or ``default``; a copy, read from memory only.

        Mutating what is returned changes nothing in the store: ``set`` is the only way in. The
        metadata block can be read as category ``"metadata"``. Values written by other processes
        are seen after the next write, ``transaction()`` or ``reload()`` of this store.
        """
        if type(category) is str and type(key) is str and category != METADATA and not (
                self._pending or self._cleared or self._tx_reads is not None):
            # The common case in a few lookups, without the calls _name and _lookup make for
            # Enum names and transactions (a small value's get is mostly such overhead).
            entries = self._doc.get(category)
            entry = None if entries is None else entries.get(key)
            return default if entry is None else decode(entry)
        category_name, key_name = _name(category, "category", self._location), _name(key, "key", self._location)
        if self._tx_reads is not None and self._tx_owner == threading.get_ident():
            self._note_read(category_name, key_name)
        entry = self._lookup(category_name, key_name)
        return default if entry is None else decode(entry)

    @_interrupts.protected
    def set(self, category: str | enum.Enum, key: str | enum.Enum, value: Any, /) -> None:
        """Store ``value`` at ``category``/``key`` and write the file before returning.

        Values: dicts with str keys, lists, tuples, str, int (64-bit), float (NaN and infinities
        included), bool, None, dataclasses, enums, datetimes, UUIDs, numpy arrays and scalars.
        numpy values are stored as the Python numbers they equal: integers and ``bool_`` as int
        and bool, every float (float16, float32, float64, 0-d arrays included) as the float64
        ``float(x)`` gives, digit for digit (``np.float32(0.1)`` is stored as
        ``0.10000000149011612``). Strings may hold lone surrogates (a non-UTF-8 file name decoded
        with ``surrogateescape``), written as ``\\uXXXX`` escapes; a high surrogate directly
        followed by a low one raises ``TrainingStatusValueError``. Anything else raises
        ``TrainingStatusTypeError`` before anything is written.
        """
        category_name, key_name = self._writable(category, key)
        entry = encode_value(value, path=self._location, category=category_name, key=key_name)
        if self._tx_owner == threading.get_ident():  # only this thread sets it to its own ident
            if self._tx_depth and not (self._closed or self._forked_in_transaction):
                # In this thread's transaction, which holds the mutex: the change joins it.
                self._pending[(category_name, key_name)] = entry
                return
            with self._guard():
                self._pending[(category_name, key_name)] = entry
                if self._tx_depth:  # joins this thread's transaction
                    return
                try:
                    self._commit()
                finally:
                    self._pending.clear()
            return
        self._set_grouped(((category_name, key_name), entry))

    @_interrupts.protected
    def delete(self, category: str | enum.Enum, key: str | enum.Enum, /) -> bool:
        """Remove ``category``/``key`` and write the file; False (and no write) if it was absent.

        A category whose last key is deleted is removed too.
        """
        category_name, key_name = self._writable(category, key)
        if self._tx_reads is not None and self._tx_owner == threading.get_ident():
            # Inside the caller's transaction, what delete returns is a read the body may act on.
            self._note_read(category_name, key_name)
        with _retold("delete it again"), self.transaction():
            if self._lookup(category_name, key_name) is None:
                return False
            self._pending[(category_name, key_name)] = None
            return True

    @_interrupts.protected
    def clear(self) -> None:
        """Start the document over, in one write: every category goes.

        The metadata block is rewritten with this store's own fields only (format version,
        trainstatus version, ``metadata=``), dropping fields a previous writer left there.
        """
        with _retold("clear the store again"), self.transaction():
            self._pending.clear()
            self._cleared = True

    @_interrupts.protected
    def save(self) -> None:
        """Write the whole document now, even if nothing changed (creates a missing file).

        Inside a transaction, the transaction's final write does it.
        """
        with _retold("save again"), self._guard():
            self._save_requested = True
            if self._tx_depth:
                return
            try:
                self._commit()
            finally:
                self._save_requested = False

    def transaction(self) -> contextlib.AbstractContextManager[StatusStore]:
        """Group changes into one write, atomic with respect to other writers.

        The lock is held for the whole body, after first picking up what other processes wrote,
        so a read-modify-write inside it (an increment) is safe across processes. ``get``, ``set``
        and ``delete`` of this store from this thread join it; other threads wait. The file is
        written once, at the end. An exception inside writes nothing and leaves memory as it was.
        Transactions nest; only the outermost writes.
        """
        return _Transaction(self)

    def _begin(self, tx: _Transaction) -> None:
        """Open ``tx``: the guard, and for the outermost the lock and what others wrote."""
        with contextlib.ExitStack() as stack:
            stack.enter_context(self._guard(tx.start))
            tx.outer = self._tx_depth == 0
            if tx.outer:
                stack.enter_context(self._storage.lock(self._remaining(), configured=self._lock_timeout))
                self._sync()
                if self._storage.conditional:
                    self._tx_reads = set()
                self._tx_owner = threading.get_ident()
                self._tx_generation = _locking.generation
                stack.callback(self._end_transaction)
            tx.savepoint = (dict(self._pending), self._save_requested, self._cleared)
            self._tx_depth += 1
            tx.stack = stack.pop_all()

    def _end(self, tx: _Transaction, failed: bool) -> None:
        """Close ``tx``: roll back (``failed``) or, for the outermost, write; then let go."""
        with tx.stack:
            self._tx_depth -= 1
            if failed:
                self._pending, self._save_requested, self._cleared = tx.savepoint
                return
            if tx.outer and (self._pending or self._save_requested or self._cleared):
                if self._tx_generation != _locking.generation:
                    raise TrainingStatusError(
                        f"A transaction on {self._location} was opened before this process was "
                        "forked; it is not committed in the child. Open a new StatusStore in the "
                        "child and redo the changes there.",
                        path=self._location,
                    )
                self._commit()

    def run_transaction(self, func: Callable[[StatusStore], Result], /) -> Result:
        """``func(store)`` inside ``transaction()``; its result. Run again if that was stale.

        For a read-modify-write that must hold across writers on every kind of storage, e.g. a
        shared counter: ``store.run_transaction(lambda s: s.set("c", "n", s.get("c", "n", 0) + 1))``.
        On a local file the lock excludes every other writer, so ``func`` runs once. On ``s3://``,
        where nothing locks, if another writer changed a key ``func`` read before the transaction
        could be written, ``func`` runs again on the new state (so it should do nothing but read and
        set on the store), until ``lock_timeout`` runs out (``TrainingStatusConflictError``).
        Inside another transaction of this thread it just joins it.
        """
        start = time.monotonic()
        deadline = None if self._lock_timeout is None else start + self._lock_timeout
        backoff = _FIRST_BACKOFF
        while True:
            try:
                with _Transaction(self, start):
                    return func(self)
            except _StaleRead:
                if self._tx_depth and self._tx_owner == threading.get_ident():
                    raise  # joined an outer transaction: that one must be redone
                backoff = self._pause(backoff, None, deadline)

    @_interrupts.protected
    def reload(self) -> None:
        """Read the file again if another writer changed it (no write, no lock held after)."""
        with self._guard():
            if self._storage.changed():
                self._load(initial=False, locked=False)

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """The whole document as a plain dict (a copy), metadata block last."""
        if self._tx_reads is not None and self._tx_owner == threading.get_ident():
            self._tx_reads.add(_ALL)
        result = {category: {key: decode(entry) for key, entry in entries.items()}
                  for category, entries in self._view().items()}
        result[METADATA] = {key: decode(entry) for key, entry in self._meta_view().items()}
        return result

    @_interrupts.protected
    def close(self) -> None:
        """Release the file handle this store keeps; later writes raise. ``get`` still works.

        Closing a closed store does nothing (so ``close()`` inside ``with StatusStore(...)`` is fine).
        """
        if self._closed:
            return
        with self._guard():
            if self._tx_depth:
                raise TrainingStatusError(
                    f"Cannot close the store on {self._location} inside its transaction; close it "
                    "after the with block.",
                    path=self._location,
                )
            self._closed = True
            self._storage.close()

    def __enter__(self) -> StatusStore:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"StatusStore({self._location!r})"

    # -- reading -----------------------------------------------------------------------------

    def _lookup(self, category: str, key: str) -> Entry | None:
        if (self._pending or self._cleared) and self._tx_owner == threading.get_ident():
            if (category, key) in self._pending:
                return self._pending[(category, key)]
            if category == METADATA:
                return self._meta_view().get(key)
            if self._cleared:
                return None
        if category == METADATA:
            return self._meta.get(key)
        entries = self._doc.get(category)
        return None if entries is None else entries.get(key)

    def _view(self) -> dict[str, dict[str, Entry]]:
        """The document as this thread sees it (its own transaction's changes included)."""
        if (self._pending or self._cleared) and self._tx_owner == threading.get_ident():
            return _apply({} if self._cleared else self._doc, self._pending)
        return self._doc

    def _meta_view(self) -> dict[str, Entry]:
        if self._cleared and self._tx_owner == threading.get_ident():
            return self._own_metadata
        return self._meta

    def _load(self, *, initial: bool, locked: bool) -> None:
        data = self._storage.read()
        self._vanished = data is None and not initial
        try:
            self._take(data, initial=initial, locked=locked)
        except BaseException:
            # Interrupted (Ctrl-C) before the document read is installed: the storage already
            # records that version as seen, which would let the next write replace it with the
            # older document in memory. Forget it, so that write reads again.
            self._storage.forget()
            raise

    def _take(self, data: bytes | None, *, initial: bool, locked: bool) -> None:
        """``_load`` from the bytes read (None: no document)."""
        if data is None:
            if not initial:
                # Removed under us (by hand, or kept aside as damaged by another store): what this
                # store last knew is the best state there is; the next write puts it back.
                logger.debug("%s disappeared; keeping what this store knew", self._location)
                return
            not_restored = ""
            if self._resume and self._storage.history():
                if not locked:
                    # Put a kept version back under the lock, after reading again: another
                    # process may be doing the same, or may have written the file meanwhile.
                    with self._storage.lock(self._lock_timeout, configured=self._lock_timeout):
                        self._load(initial=True, locked=True)
                    return
                found = self._from_history()
                if found is not None:
                    try:
                        restored = self._restore(found)
                    except _NotRestored as failure:
                        not_restored = f" {failure}"
                        found = None
                if found is not None:
                    warn(TrainingStatusMissingWarning(
                        f"Resuming, but there is no status file at {self._location}: {restored} was "
                        "put back in its place; changes written after that version are lost."
                        f"{self._missing_checkpoint_files()} "
                        f"`trainstatus history {self._location}` lists the versions kept.",
                        path=self._location,
                    ))
                    return
            if self._resume:
                warn(TrainingStatusMissingWarning(
                    f"Resuming, but there is no status file at {self._location}: curriculum "
                    f"lessons, kept checkpoints and ELO start from scratch.{not_restored} Check the run "
                    "folder, or open without resume=True for a new run.",
                    path=self._location,
                ))
            self._install(Document({}, None))
            return
        try:
            document = load_document(data)
        except Corrupt as exc:
            self._damaged(exc.reason, initial=initial, locked=locked)
            return
        if document.duplicates:
            self._duplicates(data, document)
        if initial:
            check_metadata(document.metadata, self._registered_metadata(), location=self._location)
        self._install(document)

    def _duplicates(self, data: bytes, document: Document) -> None:
        """Warn that the file names a key twice, keeping its bytes aside before a write drops one."""
        keep_copy = getattr(self._storage, "keep_copy", None)
        kept = ""
        moved: str | None = None
        if keep_copy is not None:
            try:
                moved = keep_copy(data)
                kept = f" Its bytes were kept, as they are, as {moved}."
            except OSError as exc:
                kept = f" Its bytes could not be kept aside ({exc.strerror or exc}): copy the file now."
        listed = "; ".join(str(d) for d in document.duplicates[:5])
        more = f" (and {len(document.duplicates) - 5} more)" if len(document.duplicates) > 5 else ""
        warn(TrainingStatusCorruptWarning(
            f"{self._location} gives a name more than once: {listed}{more}. The next write keeps only "
            f"the value read.{kept} Check which value is right and set it.",
            path=self._location,
            moved_to=moved,
        ))

    def _registered_metadata(self) -> dict[str, Any]:
        return {k: decode(e) for k, e in self._own_metadata.items() if k not in _OWN_METADATA}

    def _install(self, document: Document) -> None:
        found = None if document.metadata is None else document.metadata.get("stats_format_version")
        self._newer_format = str(found) if is_newer_format(found) else None
        meta = document.metadata_entries  # taken out of the file's bytes, when it was render's
        if meta is None:
            meta = {key: encode_loaded(value) for key, value in (document.metadata or {}).items()}
        meta.update(self._own_metadata)
        self._meta = meta
        self._doc = document.categories

    def _damaged(self, reason: str, *, initial: bool, locked: bool) -> None:
        if self._strict:
            raise TrainingStatusCorruptError(
                f"{self._location} is damaged: {reason}. It was left untouched because the store "
                "was opened with strict=True; repair or remove it, or open without strict to keep "
                "it aside and start from the newest intact version in its history (empty without "
                f"one; `trainstatus history {self._location}` lists them).",
                path=self._location,
            )
        if not locked:
            # Keep it aside under the lock, after reading again: another process may have moved
            # or rewritten it meanwhile.
            with self._storage.lock(self._lock_timeout if initial else self._remaining(), configured=self._lock_timeout):
                self._load(initial=initial, locked=True)
            return
        try:
            moved = self._storage.move_aside()
        except OSError as exc:
            raise TrainingStatusCorruptError(
                f"{self._location} is damaged ({reason}) and could not be kept aside: "
                f"{exc.strerror or exc}. It was left untouched; make its directory writable or "
                "move the file away by hand, then open the store again.",
                path=self._location,
            ) from exc
        found = self._from_history() if initial else None
        not_restored = ""
        if found is not None:
            try:
                restored = self._restore(found)
            except _NotRestored as failure:
                not_restored = f" {failure}"
            else:
                warn(TrainingStatusCorruptWarning(
                    f"{self._location} was damaged ({reason}); it was kept, byte for byte, as {moved}, and "
                    f"{restored} was put back in its place: changes written after that version are lost "
                    f"unless that copy still holds them.{self._missing_checkpoint_files()} "
                    f"`trainstatus history {self._location}` lists the versions kept.",
                    path=self._location,
                    moved_to=moved,
                ))
                return
        if initial:
            outcome = "the store starts empty"
        else:
            outcome = "the next write puts back what this store last read or wrote"
        warn(TrainingStatusCorruptWarning(
            f"{self._location} was damaged ({reason}); it was kept, byte for byte, as {moved} and "
            f"{outcome}.{not_restored} Inspect that file to recover anything newer.",
            path=self._location,
            moved_to=moved,
        ))
        if initial:
            self._install(Document({}, None))
        # Otherwise keep _doc: the last good state this store knew beats an empty document.

    def _missing_checkpoint_files(self) -> str:
        """A sentence naming the checkpoint files the document lists that are gone ("" if none).

        A version from the history is older than the file it stands in for: the trainer may have
        removed checkpoints it listed since (trimmed to keep_checkpoints), and a resume would try
        to load them.
        """
        listed = {category: {key: decode(entry) for key, entry in keys.items() if key in _CHECKPOINT_KEYS}
                  for category, keys in self._doc.items()}
        return describe_missing(listed)

    def _from_history(self) -> tuple[_history.Version, Document, bytes] | None:
        """The newest kept version that loads as a status document, with its document and bytes."""
        for version in reversed(self._storage.history()):
            try:
                data = _history.read(version)
                document = load_document(data)
            except (OSError, Corrupt):
                continue  # pruned meanwhile, or damaged too: an older one may do
            return version, document, data
        return None

    def _restore(self, found: tuple[_history.Version, Document, bytes]) -> str:
        """Put a kept version back in the file, byte for byte (lock held), and load it; what it was."""
        version, document, data = found
        unsure = ""
        try:
            self._storage.replace(data)
        except TrainingStatusWriteError as exc:
            if not getattr(exc, "_replaced", False):
                cause = exc.__cause__ if isinstance(exc.__cause__, OSError) else exc
                raise _NotRestored(
                    f"Version {version.sequence} of its history could not be put back ({cause.strerror or cause}); "
                    f"once the cause is fixed, `trainstatus restore {self._location} {version.sequence}` "
                    "puts it back.") from exc
            unsure = " (its directory could not be synced: it may not survive a power loss)"
        unkept = self._storage.take_warning()
        check_metadata(document.metadata, self._registered_metadata(), location=self._location)
        self._install(document)
        import datetime  # here: only a restore from the history needs it

        written = datetime.datetime.fromtimestamp(version.mtime_ns / 1e9, datetime.timezone.utc)
        if unkept is not None:
            warn(unkept)
        return f"version {version.sequence} from its history (written {written:%Y-%m-%d %H:%M:%S} UTC){unsure}"

    def _clean_leftovers_at_open(self) -> None:
        if not self._storage.leftovers():
            return
        # A live writer holds the lock while its temp file exists: only clean when nobody does.
        # A lock that cannot even be taken (read-only directory) only means: clean later.
        with contextlib.suppress(TrainingStatusLockTimeout, TrainingStatusWriteError), self._storage.lock(0):
            self._storage.cleanup()
            self._cleaned = True

    # -- writing -----------------------------------------------------------------------------

    def _writable(self, category: str | enum.Enum, key: str | enum.Enum) -> tuple[str, str]:
        if type(category) is str and type(key) is str and category != METADATA and category.isascii() and key.isascii():
            return category, key  # the common case, without four calls
        category_name = _name(category, "category", self._location)
        key_name = _name(key, "key", self._location)
        check_name(category_name, "category", self._location)
        check_name(key_name, "key", self._location)
        if category_name == METADATA:
            raise TrainingStatusValueError(
                f"Cannot change {METADATA}/{key_name} in {self._location}: the category "
                f"{METADATA!r} is reserved for the metadata block. Pass metadata={{...}} when opening "
                "the store to add fields to it.",
                path=self._location, category=METADATA, key=key_name,
            )
        return category_name, key_name

    def _set_grouped(self, change: _Change) -> None:
        """Write ``change`` together with whatever other threads are setting (see the module doc)."""
        start = time.monotonic()
        timeout = self._lock_timeout
        waiter: threading.Lock | None = None
        with self._queue:
            batch = self._open_batch
            if batch is None:
                batch = self._open_batch = _Batch()
            batch.changes.append(change)
            lead = not self._writing
            self._writing = True
        while not lead:
            with self._queue:
                if waiter is not None:
                    self._forget_waiter(waiter)  # woken, or its wait ran out
                if batch.done:
                    break
                if not self._writing:
                    self._writing = lead = True  # the leader withdrew: lead this batch
                    break
                remaining = None
                if not batch.taken and timeout is not None:
                    remaining = start + timeout - time.monotonic()
                    if remaining <= 0:
                        self._withdraw(batch, change)
                        raise self._busy(timeout)
                waiter = threading.Lock()
                waiter.acquire()
                self._waiters.append(waiter)
            try:
                _interrupts.acquire(waiter, remaining)
            except BaseException:
                # Interrupted while waiting: a change not taken yet is taken back; once taken,
                # the leader writes it (memory follows the file there, in the leader's thread).
                with self._queue:
                    self._forget_waiter(waiter)
                    if not batch.taken and not batch.done:
                        self._withdraw(batch, change)
                raise
        if not lead:
            if batch.error is not None:
                raise _error_for_waiter(batch.error, self._location)
            return
        try:
            with self._guard(start), self._storage.lock(self._remaining(), configured=timeout):
                self._write_batch(batch)
        except BaseException:
            if not batch.taken:
                # Failed before writing (a timeout, a closed store): take our change back and let
                # a waiting thread try, within its own lock_timeout.
                with self._queue:
                    self._withdraw(batch, change)
                    self._writing = False
                    self._wake_all()
            raise

    def _forget_waiter(self, waiter: threading.Lock) -> None:
        with contextlib.suppress(ValueError):
            self._waiters.remove(waiter)

    def _wake_all(self) -> None:
        """Wake every waiting thread, to look at the state again (``_queue`` held)."""
        waiters, self._waiters = self._waiters, []
        for waiter in waiters:
            waiter.release()

    def _withdraw(self, batch: _Batch, change: _Change) -> None:
        """Take ``change`` out of a batch not yet taken (``_queue`` held)."""
        for index, queued in enumerate(batch.changes):
            if queued is change:
                del batch.changes[index]
                break
        if not batch.changes and self._open_batch is batch:
            self._open_batch = None

    def _write_batch(self, batch: _Batch) -> None:
        """Write every change of ``batch`` at once and tell their threads (guard and lock held)."""
        with self._queue:
            batch.taken = True
            if self._open_batch is batch:
                self._open_batch = None
        try:
            for key, entry in batch.changes:
                self._pending[key] = entry
            self._write()
        except BaseException as exc:
            batch.error = exc
            raise
        finally:
            self._pending.clear()
            with self._queue:
                batch.done = True
                self._writing = False
                self._wake_all()

    def _busy(self, timeout: float | None) -> TrainingStatusLockTimeout:
        return TrainingStatusLockTimeout(
            f"Could not use {self._location} within {timeout} s: another thread of this "
            "process is using this store (a transaction, or a write waiting for the lock). "
            "Let it finish, or open the store with a longer lock_timeout=.",
            path=self._location,
            lock_file=self._storage.lock_file,
        )

    @contextlib.contextmanager
    def _guard(self, start: float | None = None) -> Iterator[None]:
        """Hold this store's mutex; ``lock_timeout`` counts from ``start`` (default: now) for the
        whole call."""
        timeout = self._lock_timeout
        if timeout is None:
            deadline = None
            acquired = _interrupts.acquire(self._mutex, None)
        else:
            deadline = (time.monotonic() if start is None else start) + timeout
            acquired = _interrupts.acquire(self._mutex, max(0.0, deadline - time.monotonic()))
        if not acquired:
            raise self._busy(timeout)
        if self._guard_depth == 0:
            self._deadline = deadline
        self._guard_depth += 1
        try:
            if self._closed:
                raise TrainingStatusError(
                    f"The store on {self._location} is closed; open a new StatusStore to change it.",
                    path=self._location,
                )
            if self._forked_in_transaction:
                raise TrainingStatusError(
                    f"This StatusStore on {self._location} was inside a transaction when the "
                    "process forked, so it cannot be used in the child; open a new StatusStore here.",
                    path=self._location,
                )
            yield
        finally:
            self._guard_depth -= 1
            self._mutex.release()

    def _remaining(self) -> float | None:
        """Seconds left of the current call's ``lock_timeout`` (guard held)."""
        if self._deadline is None:
            return None
        return max(0.0, self._deadline - time.monotonic())

    def _end_transaction(self) -> None:
        self._tx_reads = None
        self._pending.clear()
        self._save_requested = False
        self._cleared = False
        self._tx_owner = None

    def _note_read(self, category: str, key: str) -> None:
        # A key this transaction already set is read from its own change, not from storage.
        if (category, key) not in self._pending and not (self._cleared and category != METADATA):
            self._tx_reads.add((category, key))  # type: ignore[union-attr]  # checked by the caller

    def _sync(self, *, ask: bool = True) -> None:
        """With the lock held: pick up a file another writer changed since we last saw it.

        ``ask=False``: only if the storage already knows it is out of date (see ``Storage.stale``).
        """
        if self._storage.changed() if ask else self._storage.stale():
            logger.debug("%s changed on disk; merging", self._location)
            self._load(initial=False, locked=True)
            # A change we did not make: its writer may have died since, leaving a temp file. At
            # most once a second: processes taking turns on one file reload at every write, and a
            # listing of the directory each time was a fifth of the handoff (issue 13).
            now = time.monotonic()
            if now - self._last_cleanup >= _CLEANUP_EVERY:
                self._last_cleanup = now
                self._storage.cleanup()

    def _commit(self) -> None:
        """Write ``_doc`` with ``_pending`` laid over it (guard held; lock taken if not held)."""
        with self._storage.lock(self._remaining(), configured=self._lock_timeout):
            self._write()

    def _write(self) -> None:
        """``_commit`` with the lock held (on conditional storage: retried, see the module doc)."""
        backoff = _FIRST_BACKOFF
        while True:
            try:
                self._write_once()
                return
            except Conflict:
                backoff = self._after_conflict(backoff)

    def _after_conflict(self, backoff: float) -> float:
        """Wait, then read the version that won; ``_StaleRead`` if it changed what the body read."""
        try:
            backoff = self._pause(backoff, "conflict")
        except TrainingStatusConflictError:
            # Out of time: still show what won (other writers' values), as a write that lost does.
            with contextlib.suppress(TrainingStatusReadError):
                self._sync(ask=False)
            raise
        seen_doc, seen_meta = self._doc, self._meta
        self._sync(ask=False)
        stale = self._stale_read(seen_doc, seen_meta)
        if stale is not None:
            whole = stale == _ALL
            what = "the document" if whole else f"{stale[0]}/{stale[1]}"
            raise _StaleRead(
                f"Another writer changed {what} in {self._location} after this transaction read "
                "it, so the transaction was not written: its changes may rest on the old value. "
                "Run it again on the new state (store.run_transaction(func) does that).",
                path=self._location,
                category=None if whole else stale[0],
                key=None if whole else stale[1],
            )
        return backoff

    def _stale_read(self, seen_doc: dict[str, dict[str, Entry]], seen_meta: dict[str, Entry]) -> tuple[str, str] | None:
        """The first key the transaction read whose stored value differs from ``seen_*``."""
        for category, key in sorted(self._tx_reads or ()):
            if self._vanished:  # deleted meanwhile: whatever the body read is gone
                return category, key
            if (category, key) == _ALL:
                if seen_doc != self._doc or seen_meta != self._meta:
                    return _ALL
            elif category == METADATA:
                if seen_meta.get(key) != self._meta.get(key):
                    return category, key
            elif seen_doc.get(category, {}).get(key) != self._doc.get(category, {}).get(key):
                return category, key
        return None

    def _pause(self, backoff: float, why: str | None, deadline: float | None | bool = False) -> float:
        """Sleep about ``backoff`` s (jittered) within ``deadline`` (default: the call's); the next backoff."""
        import random  # here: only a lost conditional write (S3) pauses

        delay = random.uniform(backoff / 2, backoff)
        if deadline is False:
            deadline = self._deadline
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TrainingStatusConflictError(
                    f"Could not save {self._location}: other writers kept changing it for "
                    f"{self._lock_timeout} s (lock_timeout), each time before this store's "
                    "conditional write landed, so nothing of this call was written. Open the store "
                    "with a longer lock_timeout=, or write less often.",
                    path=self._location,
                )
            delay = min(delay, left)
        logger.debug("%s: %s; retrying in %.3f s", self._location, why or "stale transaction", delay)
        _interrupts.sleep(delay)
        return min(2 * backoff, _LONGEST_BACKOFF)

    def _write_once(self) -> None:
        self._sync(ask=False)
        if not self._cleaned:
            self._storage.cleanup()
            self._cleaned = True
        if self._newer_format is not None and not self._allow_downgrade:
            raise TrainingStatusVersionError(
                f"Refusing to write {self._location}: it has format version "
                f"{self._newer_format!r}, newer than the {STATUS_FORMAT_VERSION!r} this "
                "trainstatus writes, and rewriting it would drop what this version does not "
                "understand. Upgrade trainstatus, or open the store with allow_downgrade=True "
                f"to rewrite it in format {STATUS_FORMAT_VERSION}.",
                path=self._location,
                found_version=self._newer_format,
            )
        base = {} if self._cleared else self._doc
        document = _apply(base, self._pending)
        meta = dict(self._own_metadata) if self._cleared else self._meta
        data = self._renderer.render({**document, METADATA: meta}, base, self._pending)
        try:
            self._storage.replace(data)
        except Conflict:
            raise
        except TrainingStatusWriteError as exc:
            if getattr(exc, "_replaced", False):  # in the file, only its durability is unsure
                self._doc, self._meta = document, meta
            self._storage.take_warning()  # the error says more than a kept version's warning
            raise
        except BaseException:
            # Interrupted (Ctrl-C) somewhere around the rename: whether the file changed is
            # unknown, so the next write reads it again rather than trust memory.
            self._storage.forget()
            raise
        self._doc, self._meta = document, meta
        unkept = self._storage.take_warning()
        if unkept is not None:
            warn(unkept)  # after memory took the write: -W error cannot leave it behind the file

    def _after_fork_in_child(self) -> None:
        # Changes other threads had queued are theirs to write, in the parent.
        self._queue = threading.Lock()
        self._waiters = []
        self._open_batch = None
        self._writing = False
        if self._tx_depth:
            self._forked_in_transaction = True
        else:
            self._mutex = threading.RLock()
            self._guard_depth = 0


# run_transaction is one too: its with statement's end, on the way out of the body (a line of its
# own frame), comes before __exit__ is called. What is held back in those frames is delivered by
# the next wait or the end of the transaction's call.
_interrupts.BOUNDARIES.update(
    (_Transaction.__enter__.__code__, _Transaction.__exit__.__code__, StatusStore.run_transaction.__code__)
)


def _after_fork_in_child() -> None:
    for store in list(_live_stores):
        store._after_fork_in_child()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
