"""The options of ``StatusStore``: checked at the boundary, and turned into its storage.

Options arrive from YAML configs as strings ("no" for False), from callers as ``pathlib.Path`` or
bytes: each is checked for its type and range here, and the error names the option.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Mapping
TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from typing import Any

from ._lock import path_lock as _locking
from ._errors import TrainingStatusTypeError, TrainingStatusValueError
from ._remote.location import check_location
from ._remote.backends import object_store_url, open_object_store
from ._storage.base import Storage
from ._storage.local import LocalFile


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


def open_storage(
    path: Any,
    *,
    resume: Any,
    durable: Any,
    lock_timeout: Any,
    lock: Any,
    metadata: Any,
    strict: Any,
    allow_downgrade: Any,
    history: Any,
    storage_options: Any,
) -> Storage:
    """The storage ``StatusStore(path, ...)`` writes through, once every option is checked."""
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
    described = object_store_url(given)
    if lock != "flock" and described is not None:
        raise TrainingStatusValueError(
            f"lock={lock!r} is for local paths; {given!r} is {described}, which takes no lock "
            "(writes are conditional). Leave lock= out.",
            path=given,
        )
    storage: Storage
    if described is not None:
        if history:
            raise TrainingStatusValueError(
                f"history={history} is kept for local files only; {given!r} is {described}. "
                "Turn on versioning in the bucket to keep earlier versions, and leave history= out.",
                path=given,
            )
        storage = open_object_store(given, storage_options)
    elif storage_options is not None:
        raise TrainingStatusValueError(
            f"storage_options= is for s3://, gs:// and az:// URLs; {given!r} is a local path, which takes "
            "none. Leave storage_options out, or give an object store URL such as s3://bucket/key.",
            path=given,
        )
    else:
        storage = LocalFile(os.path.abspath(given), durable=durable, lock=lock,
                            history=DEFAULT_HISTORY if history is None else history)
    return storage


def check_lock_timeout(lock_timeout: float | None, location: str) -> float | None:
    """``lock_timeout`` as the store keeps it: None for forever, else seconds (checked)."""
    if lock_timeout is not None and not lock_timeout >= 0:
        raise TrainingStatusValueError(
            f"StatusStore option lock_timeout= must be a number of seconds >= 0 (0: do not wait) or None "
            f"(wait forever), not {lock_timeout!r}, for {location}.",
            path=location,
        )
    if lock_timeout is not None and lock_timeout > threading.TIMEOUT_MAX:
        return None  # longer than the platform can wait for (inf included): forever
    return lock_timeout
