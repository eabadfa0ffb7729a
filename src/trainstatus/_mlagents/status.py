"""The ML-Agents drop-in: ``StatusType``, ``StatusMetaData`` and ``GlobalTrainingStatus``.

Same names, same static methods and the same file as ``mlagents.trainers.training_status``, but
backed by a ``StatusStore``: once bound to a path, every ``set_parameter_state`` is on disk
before it returns, instead of once at exit.
"""

from __future__ import annotations

import dataclasses
import enum
import os
import sys
import threading
from collections.abc import Iterator, Mapping
from typing import Any

from .._errors import TrainingStatusError, TrainingStatusTypeError, TrainingStatusVersionWarning, warn
from .._load import STATUS_FORMAT_VERSION, compare_metadata
from .._storage.memory import Memory
from .._store import StatusStore
from .._version import __version__

__all__ = ["GlobalTrainingStatus", "StatusMetaData", "StatusType"]

_MISSING = object()


class StatusType(enum.Enum):
    """The keys ML-Agents stores (and the reserved metadata category)."""

    LESSON_NUM = "lesson_num"
    STATS_METADATA = "metadata"
    CHECKPOINTS = "checkpoints"
    FINAL_CHECKPOINT = "final_checkpoint"
    ELO = "elo"


def _running_version(module: str, distribution: str) -> str | None:
    """The version of ``module`` this run uses, or None when its distribution is not installed.

    ML-Agents records ``mlagents.trainers.__version__`` and ``torch.__version__``. A module already
    imported answers itself; otherwise the installed distribution's metadata does, as importing
    torch only to read its version takes seconds.
    """
    version = getattr(sys.modules.get(module), "__version__", None)
    if version is not None:
        return str(version)  # torch's is a TorchVersion, a str subclass
    try:
        import importlib.metadata  # 20-30 ms: only when a metadata block is made

        return importlib.metadata.version(distribution)
    except importlib.metadata.PackageNotFoundError:
        return None


def installed_mlagents_version() -> str | None:
    return _running_version("mlagents.trainers", "mlagents")


def installed_torch_version() -> str | None:
    return _running_version("torch", "torch")


@dataclasses.dataclass
class StatusMetaData:
    """The metadata block: format version, library versions, and any ``extra`` fields.

    As in ML-Agents, ``StatusMetaData()`` describes this run: ``mlagents_version`` and
    ``torch_version`` are those of the installed ``mlagents`` and ``torch`` (``None`` when not
    installed), read from the imported module if there is one, else from the distribution's
    metadata, without importing torch. ``trainstatus_version`` is recorded but never compared: the
    format version says whether a file can be read. The other fields are compared by
    ``check_compatibility`` when both sides have them.
    """

    stats_format_version: str = STATUS_FORMAT_VERSION
    trainstatus_version: str = __version__
    # The factories' names are what the API reference shows as these fields' defaults.
    mlagents_version: str | None = dataclasses.field(default_factory=installed_mlagents_version)
    torch_version: str | None = dataclasses.field(default_factory=installed_torch_version)
    extra: dict[str, Any] = dataclasses.field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The fields as they stand in the file (``None`` fields left out, ``extra`` inlined)."""
        result: dict[str, Any] = {
            "stats_format_version": self.stats_format_version,
            "trainstatus_version": self.trainstatus_version,
        }
        if self.mlagents_version is not None:
            result["mlagents_version"] = self.mlagents_version
        if self.torch_version is not None:
            result["torch_version"] = self.torch_version
        result.update(self.extra)
        return result

    @classmethod
    def from_dict(cls, import_dict: Mapping[str, Any]) -> StatusMetaData:
        """Read a metadata block; fields this class does not name go to ``extra``.

        Fields the block lacks take their defaults (this run's versions), as in ML-Agents.
        """
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        given = {k: v for k, v in import_dict.items() if k in known}
        extra = {k: v for k, v in import_dict.items() if k not in known}
        return cls(**given, extra=extra)

    def check_compatibility(self, other: StatusMetaData) -> None:
        """Warn (``TrainingStatusVersionWarning``) for each field that differs from ``other``'s.

        ``self`` is what a file holds, ``other`` the running versions, as in ML-Agents'
        ``StatusMetaData.from_dict(loaded).check_compatibility(StatusMetaData())``.
        """
        expected = other.to_dict()
        expected.pop("trainstatus_version")
        for message in compare_metadata(self.to_dict(), expected, location="The status file"):
            warn(TrainingStatusVersionWarning(message))


class _SavedState(dict[str, dict[str, Any]]):
    """A copy of the whole status in which an unknown category reads as ``{}``.

    ML-Agents' ``saved_state`` is a ``defaultdict``: code written for it indexes categories that
    may not exist yet. The ``{}`` handed out is not stored (this is a copy; nothing is created).
    """

    def __missing__(self, category: Any) -> dict[str, Any]:
        return {}


_READ_ONLY = (
    "GlobalTrainingStatus.saved_state is a read-only view of the status written through by "
    "trainstatus; nothing was stored. Call GlobalTrainingStatus.set_parameter_state(category, key, "
    "value) to change a value."
)


class _ReadOnlyCategory(dict[str, Any]):
    """One category of ``SavedStateView``: a copy that refuses to be changed, so that code
    assigning into ``saved_state[category][key]`` (which worked on ML-Agents' dict) fails loudly
    instead of changing a copy nobody reads."""

    def _refuse(self, *args: Any, **kwargs: Any) -> Any:
        raise TrainingStatusTypeError(_READ_ONLY)

    __setitem__ = __delitem__ = __ior__ = _refuse
    update = pop = popitem = setdefault = clear = _refuse


class SavedStateView(Mapping[str, dict[str, Any]]):
    """The live, read-only ``saved_state`` of a class whose metaclass cannot be changed.

    ML-Agents' ``GlobalTrainingStatus`` is a plain class, so its ``saved_state`` cannot become a
    property: the plugin puts this view there instead. Every read sees the status as it is now
    (a copy, as ``get_parameter_state`` gives); an unknown category reads as ``{}``. Assigning to
    it raises ``TypeError`` rather than being silently dropped.
    """

    def __getitem__(self, category: str) -> dict[str, Any]:
        return _ReadOnlyCategory(GlobalTrainingStatus.saved_state[category])

    def __setitem__(self, category: str, value: Any) -> None:
        raise TrainingStatusTypeError(_READ_ONLY, category=category)

    def __delitem__(self, category: str) -> None:
        raise TrainingStatusTypeError(_READ_ONLY, category=category)

    def __contains__(self, category: object) -> bool:  # Mapping's would call __getitem__, never a KeyError
        return category in GlobalTrainingStatus.store().to_dict()

    def __iter__(self) -> Iterator[str]:
        return iter(GlobalTrainingStatus.saved_state)

    def __len__(self) -> int:
        return len(GlobalTrainingStatus.store().to_dict())

    def __repr__(self) -> str:
        return f"SavedStateView({GlobalTrainingStatus.store().to_dict()!r})"


class _GlobalTrainingStatusType(type):
    @property
    def saved_state(cls) -> dict[str, dict[str, Any]]:
        """The whole status as a plain dict (a copy: change it with ``set_parameter_state``).

        As in ML-Agents, an unknown category reads as ``{}`` (here without creating it).
        """
        return _SavedState(GlobalTrainingStatus.store().to_dict())


def _memory_store() -> StatusStore:
    return StatusStore._on_storage(Memory())


class GlobalTrainingStatus(metaclass=_GlobalTrainingStatusType):
    """Process-wide training status, as in ML-Agents, written through to one file.

    Until it is bound to a path the status lives in memory only. Bind it with ``load_state(path)``
    when resuming (a missing file warns), ``start_fresh(path)`` when starting a new run, or
    ``save_state(path)``; from then on every ``set_parameter_state`` is written to that file
    before it returns. Keyword options of those three calls are passed to ``StatusStore``
    (``metadata=``, ``durable=``, ``lock_timeout=``, ``strict=``...); options not given again
    are those of the previous binding (``reset()`` forgets them).
    """

    _store: StatusStore = _memory_store()
    _bound: bool = False
    _options: dict[str, Any] = {}  # StatusStore options of the last binding, reused by the next
    _mutex = threading.RLock()

    @staticmethod
    def store() -> StatusStore:
        """The ``StatusStore`` currently behind the global status."""
        return GlobalTrainingStatus._store

    @staticmethod
    def load_state(path: str | os.PathLike[str], **options: Any) -> None:
        """Resume from ``path`` and bind to it. A missing or damaged file warns and comes back from
        the newest intact version in its history, or starts empty when there is none.

        Values set before binding that the file does not hold are kept and written to it.
        """
        with GlobalTrainingStatus._mutex:
            options = GlobalTrainingStatus._merged(options)
            store = StatusStore(path, resume=True, **options)
            if _carries_values(GlobalTrainingStatus._store):
                with store.transaction():
                    _carry_over(GlobalTrainingStatus._store, store, replace=False)
            GlobalTrainingStatus._install(store, options)

    @staticmethod
    def start_fresh(path: str | os.PathLike[str], *, overwrite: bool = False, **options: Any) -> None:
        """Start a new run writing to ``path``; bind to it.

        A file that already holds a status is an error unless ``overwrite=True`` (then its
        categories are removed, in the same write as the values set before binding): resume it
        with ``load_state`` instead. Nothing is written until there is something to write.
        """
        with GlobalTrainingStatus._mutex:
            options = GlobalTrainingStatus._merged(options)
            store = StatusStore(path, **options)
            existing = [c for c in store.to_dict() if c != StatusType.STATS_METADATA.value]
            if existing and not overwrite:
                store.close()
                raise TrainingStatusError(
                    f"{store.path} already holds a training status ({', '.join(existing[:5])}"
                    f"{', ...' if len(existing) > 5 else ''}). Resume it with "
                    "GlobalTrainingStatus.load_state(path), or pass overwrite=True to start_fresh "
                    "to replace it.",
                    path=store.path,
                )
            if existing or _carries_values(GlobalTrainingStatus._store):
                with store.transaction():
                    store.clear()
                    _carry_over(GlobalTrainingStatus._store, store, replace=True)
            GlobalTrainingStatus._install(store, options)

    @staticmethod
    def save_state(path: str | os.PathLike[str], **options: Any) -> None:
        """Write the whole status to ``path`` now and bind to it (ML-Agents calls this at exit).

        Already bound to ``path``: the file is rewritten as it stands (nothing else changes).
        Otherwise the file at ``path`` is replaced, in one write, by the current status.
        """
        with GlobalTrainingStatus._mutex:
            current = GlobalTrainingStatus._store
            if GlobalTrainingStatus._bound and os.path.realpath(current.path) == os.path.realpath(path):
                current.save()
                return
            options = GlobalTrainingStatus._merged(options)
            store = StatusStore(path, **options)
            with store.transaction():
                store.clear()
                _carry_over(current, store, replace=True)
                store.save()
            GlobalTrainingStatus._install(store, options)

    @staticmethod
    def set_parameter_state(category: str, key: StatusType | str, value: Any) -> None:
        """Store ``value``; written to the bound file before returning."""
        with GlobalTrainingStatus._mutex:  # never into a store a concurrent rebinding closes
            GlobalTrainingStatus._store.set(category, key, value)

    @staticmethod
    def get_parameter_state(category: str, key: StatusType | str) -> Any:
        """The stored value, or None when unknown (nothing is created)."""
        return GlobalTrainingStatus._store.get(category, key)

    @staticmethod
    def reset() -> None:
        """Forget everything and unbind (the file is left as it is). Tests call this between runs."""
        with GlobalTrainingStatus._mutex:
            if GlobalTrainingStatus._bound:
                GlobalTrainingStatus._store.close()
            GlobalTrainingStatus._store = _memory_store()
            GlobalTrainingStatus._bound = False
            GlobalTrainingStatus._options = {}

    @staticmethod
    def _configure(**options: Any) -> None:
        """Options for the next binding, where the caller gives none (the ML-Agents plugin's metadata)."""
        with GlobalTrainingStatus._mutex:
            GlobalTrainingStatus._options = {**GlobalTrainingStatus._options, **options}

    @staticmethod
    def _bound_to(path: str | os.PathLike[str]) -> bool:
        """Is the status bound to ``path`` (the same file, however it is spelled)?"""
        with GlobalTrainingStatus._mutex:
            store = GlobalTrainingStatus._store
            return GlobalTrainingStatus._bound and os.path.realpath(store.path) == os.path.realpath(path)

    @staticmethod
    def _merged(options: dict[str, Any]) -> dict[str, Any]:
        """The previous binding's options overridden by these; ``resume`` is the call's to say."""
        if "resume" in options:
            raise TrainingStatusTypeError(
                f"GlobalTrainingStatus takes no resume= option (resume={options['resume']!r} was given): resume is "
                "implied by the call: load_state resumes, start_fresh and save_state do not. Leave resume= out.")
        return {**GlobalTrainingStatus._options, **options}

    @staticmethod
    def _install(store: StatusStore, options: dict[str, Any]) -> None:
        GlobalTrainingStatus._options = options
        if GlobalTrainingStatus._bound:
            GlobalTrainingStatus._store.close()
        GlobalTrainingStatus._store = store
        GlobalTrainingStatus._bound = True


def _carries_values(store: StatusStore) -> bool:
    return any(c != StatusType.STATS_METADATA.value for c in store.to_dict())


def _carry_over(source: StatusStore, target: StatusStore, *, replace: bool) -> None:
    """Set ``source``'s values in ``target`` (inside the caller's transaction)."""
    held = source.to_dict()
    held.pop(StatusType.STATS_METADATA.value, None)
    for category, entries in held.items():
        for key, value in entries.items():
            if replace or target.get(category, key, _MISSING) is _MISSING:
                target.set(category, key, value)
