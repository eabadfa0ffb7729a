"""The store's public face: ``StatusStore``, the document in memory written through on every change.

The class reads like the manual; each question it answers lives in a layer of its own, each
built on the one listed before it:

- ``_document``: the document in memory and the changes not yet written (``get`` reads it);
- ``_guard``: one call at a time, within ``lock_timeout``; a closed store refuses here;
- ``_opening``: reading the stored document, and recovery when it is damaged or missing;
- ``_conflicts``: picking up another writer's version; retrying a conditional write that lost;
- ``_committing``: one write of memory with the pending changes laid over it;
- ``_group_commit``: the ``set`` calls of several threads written together;
- ``_transactions``: several changes in one write, the lock held from the first read;
- ``_options`` checks the options and picks the storage; ``_fork`` resets stores in a child.

The data path of a ``set``: ``StatusStore.set`` checks the names and encodes the value,
``_set_grouped`` queues it and, leading, takes the guard and the lock; ``_write_batch`` lays the
batch into ``_pending``; ``_write`` / ``_write_once`` catch up with other writers, render the
document and replace the stored one; memory takes the new document only once the storage has it.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
import weakref
from collections.abc import Callable, Mapping

from . import _fork, _interrupts
from ._codec.encoding import encode_value
from ._codec.values import decode
from ._committing import retold
from ._conflicts import FIRST_BACKOFF, _StaleRead
from ._document import ALL, as_name
from ._errors import TrainingStatusError
from ._load import METADATA
from ._options import DEFAULT_HISTORY, check_lock_timeout, open_storage
from ._storage.base import Storage
from ._transactions import _Transaction, _Transactions

__all__ = ["DEFAULT_HISTORY", "StatusStore"]

_live_stores: weakref.WeakSet[StatusStore] = weakref.WeakSet()
_fork.watch(_live_stores)
TYPE_CHECKING = False  # typing.TYPE_CHECKING: typing (and the re it imports) are 4 ms of every start
if TYPE_CHECKING:  # annotations are strings at run time; the API reference reads them from the source
    import enum
    from typing import Any, TypeVar

    # Named for the API reference: run_transaction(func: Callable[[StatusStore], Result]) -> Result.
    Result = TypeVar("Result")


class StatusStore(_Transactions):
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
    - ``storage_options``: for an object store's URL given as ``path``. ``s3://bucket/key`` (the
      ``s3`` extra): ``endpoint_url``, ``key``, ``secret``, ``token``, ``region_name``, ``profile``,
      ``anon``, ``client_kwargs``, ``config_kwargs``, as s3fs names them. ``gs://bucket/object``
      (the ``gcs`` extra): ``project``, ``token``, ``endpoint_url``, as gcsfs names them.
      ``az://container/blob`` or ``abfs[s]://container@account.dfs.core.windows.net/blob`` (the
      ``azure`` extra): ``account_name``, ``account_key``, ``sas_token``, ``connection_string``,
      ``credential``, ``account_host``, as adlfs names them. Without them the SDK's usual
      environment applies. Each also takes ``conditional_writes``: ``"checked"`` (the default:
      the first write of a process to a server proves that it honours conditional writes, and a
      server that does not is refused) or ``"unchecked"`` (no proof, for a status only one writer
      ever writes). Such a store takes no lock: each write is a conditional upload, retried over
      the new version when another writer got in first.
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
        storage = open_storage(
            path, resume=resume, durable=durable, lock_timeout=lock_timeout, lock=lock, metadata=metadata,
            strict=strict, allow_downgrade=allow_downgrade, history=history, storage_options=storage_options,
        )
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
        lock_timeout = check_lock_timeout(lock_timeout, storage.location)
        self._init_document(storage, metadata)
        self._init_guard(lock_timeout)
        self._init_opening(resume=resume, strict=strict)
        self._init_conflicts()
        self._init_committing(allow_downgrade=allow_downgrade)
        self._init_group_commit()
        self._init_transactions()
        self._load(initial=True, locked=False)
        self._clean_leftovers_at_open()
        _live_stores.add(self)

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
        category_name, key_name = as_name(category, "category", self._location), as_name(key, "key", self._location)
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
        with retold("delete it again"), self.transaction():
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
        with retold("clear the store again"), self.transaction():
            self._pending.clear()
            self._cleared = True

    @_interrupts.protected
    def save(self) -> None:
        """Write the whole document now, even if nothing changed (creates a missing file).

        Inside a transaction, the transaction's final write does it.
        """
        with retold("save again"), self._guard():
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

    def run_transaction(self, func: Callable[[StatusStore], Result], /) -> Result:
        """``func(store)`` inside ``transaction()``; its result. Run again if that was stale.

        For a read-modify-write that must hold across writers on every kind of storage, e.g. a
        shared counter: ``store.run_transaction(lambda s: s.set("c", "n", s.get("c", "n", 0) + 1))``.
        On a local file the lock excludes every other writer, so ``func`` runs once (twice only when a
        writer that got in through a lock file deleted by hand made the file meanwhile). On ``s3://``,
        where nothing locks, if another writer changed a key ``func`` read before the transaction
        could be written, ``func`` runs again on the new state (so it should do nothing but read and
        set on the store), until ``lock_timeout`` runs out (``TrainingStatusConflictError``).
        Inside another transaction of this thread it just joins it.
        """
        start = time.monotonic()
        deadline = None if self._lock_timeout is None else start + self._lock_timeout
        backoff = FIRST_BACKOFF
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
            self._tx_reads.add(ALL)
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


# run_transaction's with statement ends, on the way out of the body, on a line of its own frame,
# before __exit__ is called: a boundary too (see _transactions). What is held back in those frames
# is delivered by the next wait or the end of the transaction's call.
_interrupts.BOUNDARIES.add(StatusStore.run_transaction.__code__)
