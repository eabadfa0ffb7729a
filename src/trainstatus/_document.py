"""The store's document in memory, and the changes not yet written over it.

``_doc`` is the document as this store last read or wrote it (category -> key -> ``Entry``); it
is never mutated, only replaced, so ``get`` reads it without a lock and never sees half of a
change. ``_meta`` is its metadata block, this store's own fields laid over what the file had.
``_pending`` holds changes not yet written: one key for a plain ``set``, many inside a
transaction. A write (``_committing``), under the lock: if the stored file changed since ``_doc``
was taken (another process or store wrote it), re-read it into ``_doc``; lay ``_pending`` over it
key by key (``apply``); write that; make it the new ``_doc``. If the write fails, ``_doc`` still is
what is on disk and the pending change is dropped, so memory always matches the file.

The thread inside a transaction (``_tx_owner``) sees its own pending changes; every other thread
sees ``_doc``.
"""

from __future__ import annotations

import threading
from collections.abc import Mapping

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    import enum
    from typing import Any

from ._codec.encoding import encode_loaded, encode_value
from ._codec.names import check_name
from ._codec.values import Entry, decode
from ._errors import TrainingStatusTypeError, TrainingStatusValueError
from ._lazy import OnFirstUse
from ._load import METADATA, STATUS_FORMAT_VERSION, Document, is_newer_format
from ._codec.renderer import Renderer
from ._storage.base import Storage
from ._version import __version__

if not TYPE_CHECKING:
    # enum (1-2 ms) is not imported for a check that a str name never reaches: an Enum member can
    # only exist once enum is imported, and orjson's own setup imports it at the first write anyway.
    enum = OnFirstUse("enum", globals())

OWN_METADATA = ("stats_format_version", "trainstatus_version")
_OWN_ENTRIES = {  # their entries, the same for every store (entries are immutable)
    "stats_format_version": encode_loaded(STATUS_FORMAT_VERSION),
    "trainstatus_version": encode_loaded(__version__),
}
ALL = ("", "")  # in ``_tx_reads``: the body read the whole document (``to_dict``)


def as_name(value: Any, what: str, location: str) -> str:
    """``value`` (a str, or an Enum whose value is one) as the str it names; ``what`` for the error."""
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


Change = tuple[tuple[str, str], Entry]


def apply(document: Mapping[str, dict[str, Entry]], pending: Mapping[tuple[str, str], Entry | None]) -> dict[str, dict[str, Entry]]:
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


class _Document:
    """The document in memory and the pending changes (the bottom of the store's layers)."""

    def _init_document(self, storage: Storage, metadata: Mapping[str, Any] | None) -> None:
        self._storage = storage
        self._location = storage.location
        self._pending: dict[tuple[str, str], Entry | None] = {}
        self._save_requested = False
        self._cleared = False  # clear() pending: start from an empty document, own metadata only
        self._tx_depth = 0
        self._tx_owner: int | None = None
        # The keys a transaction's body read, on conditional storage (see _conflicts).
        self._tx_reads: set[tuple[str, str]] | None = None
        self._own_metadata = self._metadata_entries(metadata or {})
        self._doc: dict[str, dict[str, Entry]] = {}
        self._meta: dict[str, Entry] = {}
        self._renderer = Renderer()  # keeps each category's bytes between writes (see _codec.renderer)
        self._newer_format: str | None = None

    def _metadata_entries(self, metadata: Mapping[str, Any]) -> dict[str, Entry]:
        entries = dict(_OWN_ENTRIES)
        for field, value in metadata.items():
            name = as_name(field, "metadata field", self._location)
            if name in OWN_METADATA:
                raise TrainingStatusValueError(
                    f"The metadata field {name!r} is written by trainstatus itself and cannot be "
                    f"given for {self._location}; leave it out of metadata=.",
                    path=self._location, category=METADATA, key=name,
                )
            entries[name] = encode_value(value, path=self._location, category=METADATA, key=name)
        return entries

    def _registered_metadata(self) -> dict[str, Any]:
        return {k: decode(e) for k, e in self._own_metadata.items() if k not in OWN_METADATA}

    def _install(self, document: Document) -> None:
        found = None if document.metadata is None else document.metadata.get("stats_format_version")
        self._newer_format = str(found) if is_newer_format(found) else None
        meta = document.metadata_entries  # taken out of the file's bytes, when it was render's
        if meta is None:
            meta = {key: encode_loaded(value) for key, value in (document.metadata or {}).items()}
        meta.update(self._own_metadata)
        self._meta = meta
        self._doc = document.categories

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
            return apply({} if self._cleared else self._doc, self._pending)
        return self._doc

    def _meta_view(self) -> dict[str, Entry]:
        if self._cleared and self._tx_owner == threading.get_ident():
            return self._own_metadata
        return self._meta

    def _note_read(self, category: str, key: str) -> None:
        # A key this transaction already set is read from its own change, not from storage.
        if (category, key) not in self._pending and not (self._cleared and category != METADATA):
            self._tx_reads.add((category, key))  # type: ignore[union-attr]  # checked by the caller

    def _writable(self, category: str | enum.Enum, key: str | enum.Enum) -> tuple[str, str]:
        if type(category) is str and type(key) is str and category != METADATA and category.isascii() and key.isascii():
            return category, key  # the common case, without four calls
        category_name = as_name(category, "category", self._location)
        key_name = as_name(key, "key", self._location)
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
