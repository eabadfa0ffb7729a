"""The file's bytes for a store's successive documents, rebuilding only what a write changed.

``_codec.document.render`` builds the file from every key's bytes on each call: one join over a list of
four pieces per key, rebuilt each time, so its cost grew with the number of keys and categories
(60,000 pieces, 3-9 ms, for a 1 MB file of many small values) although a write changes one key.
A store's ``Renderer`` keeps, between writes, each category's pieces: a small category's as one
piece, a big one's in chunks of a few hundred keys with the chunk of each key. A write rebuilds
the categories it touched (in a big one, the chunks holding the changed keys) and joins the rest
as they were.

What makes a kept piece current is the identity of the dict it was made from: a store never
changes a document's category dicts in place, it lays a change over a copy of the touched ones
(``_document.apply``) and shares the others. So a category whose dict is the one rendered last time
is unchanged; one whose dict is new is rebuilt whole, unless the caller says which document it
was made from (``base``) and which keys it changed (``changed``), and the category's dict in
``base`` is the one rendered last time: then only those keys' chunks are rebuilt. The output is
byte for byte ``_codec.document.render``'s.
"""

from __future__ import annotations

import operator
import threading
from collections.abc import Iterable, Mapping
from itertools import chain, compress, count, islice, repeat

from .document import _CATEGORY_SEP, _ENTRY_SEP, _RAW, render
from .names import _name_bytes
from .values import Entry

__all__ = ["Renderer"]

# Keys per chunk of a big category: a changed key costs a rebuild of its chunk (a few µs per
# hundred keys), a write costs a piece per chunk. A chunk grows by appended keys up to twice this.
CHUNK = 256
# Pieces are joined into one, so that a write joins few pieces; but a piece this big (a long
# checkpoint list) is kept apart, so that its bytes are not copied twice per write.
JOIN_BELOW = 1 << 16
_OPEN = b": {\n    "
_CLOSE = b"\n  }"
_KEY_SEP = b": "


def _pieces(names: list[bytes], raws: Iterable[bytes]) -> list[bytes]:
    """``"key": raw`` lines with the separators between them (none after the last), in C."""
    pieces = list(chain.from_iterable(zip(names, repeat(_KEY_SEP), raws, repeat(_ENTRY_SEP))))
    pieces.pop()
    return pieces


def _packed(pieces: list[bytes]) -> tuple[bytes, ...]:
    """``pieces`` joined into as few as may be, each big one (see ``JOIN_BELOW``) left apart."""
    if max(map(len, pieces)) < JOIN_BELOW:
        return (b"".join(pieces),)
    packed: list[bytes] = []
    run: list[bytes] = []
    for piece in pieces:
        if len(piece) < JOIN_BELOW:
            run.append(piece)
            continue
        if run:
            packed.append(b"".join(run))
            run = []
        packed.append(piece)
    if run:
        packed.append(b"".join(run))
    return tuple(packed)


class _Chunk:
    __slots__ = ("keys", "parts")

    def __init__(self, keys: list[str], entries: Mapping[str, Entry]) -> None:
        self.keys = keys
        self.parts = _packed(_pieces(_name_bytes(keys), map(_RAW, map(entries.__getitem__, keys))))


class _Category:
    """One category as rendered: the dict it was made from and its pieces, separator last."""

    __slots__ = ("chunks", "entries", "index", "name", "parts")

    def __init__(self, name: str, entries: Mapping[str, Entry]) -> None:
        self.name = name
        self.entries = entries  # held, so that no other dict can take its identity
        self.index: dict[str, _Chunk] | None = None  # key -> chunk, made by the first patch
        (head,) = _name_bytes((name,))
        if not entries:
            self.chunks: list[_Chunk] | None = None
            self.parts: tuple[bytes, ...] = (head + b": {}", _CATEGORY_SEP)
        elif len(entries) <= CHUNK:
            self.chunks = None
            pieces = [head, _OPEN, *_pieces(_name_bytes(entries), map(_RAW, entries.values())), _CLOSE]
            self.parts = (*_packed(pieces), _CATEGORY_SEP)
        else:
            keys = list(entries)
            self.chunks = [_Chunk(keys[i:i + CHUNK], entries) for i in range(0, len(keys), CHUNK)]
            self._assemble(head)

    def _assemble(self, head: bytes | None = None) -> None:
        assert self.chunks is not None
        if head is None:
            (head,) = _name_bytes((self.name,))
        parts = [head + _OPEN]
        for chunk in self.chunks:
            parts += chunk.parts
            parts.append(_ENTRY_SEP)
        parts[-1] = _CLOSE
        parts.append(_CATEGORY_SEP)
        self.parts = tuple(parts)

    def patched(self, entries: dict[str, Entry], keys: Iterable[str]) -> _Category:
        """This category for ``entries``: this one's dict with (only) ``keys`` set or deleted."""
        old = self.entries
        if self.chunks is None or not entries:
            return _Category(self.name, entries)  # a small one costs little more to build again
        index = self.index
        if index is None:
            index = {}
            for chunk in self.chunks:
                index.update(zip(chunk.keys, repeat(chunk)))
        # Copy on write: the keys of each chunk that changes, in a new list; no chunk changes.
        replaced: dict[_Chunk, list[str]] = {}
        added = 0
        for key in keys:
            if key in entries:
                if key in old:
                    chunk = index[key]
                    if chunk not in replaced:
                        replaced[chunk] = list(chunk.keys)
                else:
                    added += 1
            elif key in old:
                chunk = index.pop(key)
                left = replaced.get(chunk)
                if left is None:
                    left = replaced[chunk] = list(chunk.keys)
                left.remove(key)
        chunks = list(self.chunks)
        # Keys new to the category come last in ``entries`` (a dict keeps insertion order); they
        # join the last chunk, or start one when it is full.
        tail = list(islice(reversed(entries), added))
        tail.reverse()
        for key in tail:
            last = chunks[-1]
            keys_of_last = replaced.get(last)
            if keys_of_last is None:
                keys_of_last = replaced[last] = list(last.keys)
            if len(keys_of_last) >= 2 * CHUNK:
                last = _Chunk.__new__(_Chunk)  # a place for the new chunk
                chunks.append(last)
                keys_of_last = replaced[last] = []
            keys_of_last.append(key)
        made: dict[_Chunk, _Chunk | None] = {}
        for chunk, chunk_keys in replaced.items():
            if chunk_keys:
                new = made[chunk] = _Chunk(chunk_keys, entries)
                index.update(zip(chunk_keys, repeat(new)))
            else:
                made[chunk] = None
        out = _Category.__new__(_Category)
        out.name, out.entries, out.index = self.name, entries, index
        out.chunks = [c for c in (made.get(chunk, chunk) for chunk in chunks) if c is not None]
        self.index = None  # handed on and changed: no longer this one's
        if sum(len(chunk.keys) for chunk in out.chunks) != len(entries) or not out.chunks:
            return _Category(self.name, entries)  # not made as the caller said: build it whole
        out._assemble()
        return out


class Renderer:
    """``_codec.document.render`` for one store's successive documents, keeping what did not change.

    Not shared between threads: a store renders under its write lock; a second thread arriving
    while one renders gets the uncached render rather than wait or disturb the cache.
    """

    fallback = True  # tests turn it off, so that an error in here is not hidden by the fallback

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._names: list[str] = []
        self._categories: list[_Category] = []
        self._by_name: dict[str, _Category] = {}

    def render(
        self,
        document: Mapping[str, Mapping[str, Entry]],
        base: Mapping[str, Mapping[str, Entry]] | None = None,
        changed: Iterable[tuple[str, str]] = (),
    ) -> bytes:
        """``_codec.document.render(document)``.

        ``base`` and ``changed``, together: ``document`` is ``base`` with the (category, key) pairs
        of ``changed`` set or deleted (and categories left empty removed), each touched category a
        new dict and every other one ``base``'s own. Nothing in either may have been changed in
        place since it was rendered. Without them a changed category is rebuilt whole.
        """
        if not document or not self._lock.acquire(blocking=False):
            return render(document)
        try:
            return self._render(document, base, changed)
        except Exception:
            # Nothing kept is trusted any more, and a write never fails for the sake of a cache.
            self._forget()
            if not self.fallback:
                raise
            return render(document)
        except BaseException:  # interrupted half way (Ctrl-C): as above, and the interrupt goes on
            self._forget()
            raise
        finally:
            self._lock.release()

    def _forget(self) -> None:
        self._names, self._categories, self._by_name = [], [], {}

    def after_fork_in_child(self) -> None:
        """A thread of the parent may have been rendering at the fork: its lock would stay held
        in the child (every write there uncached) and what it kept may be half updated."""
        self._lock = threading.Lock()
        self._forget()

    def _render(
        self,
        document: Mapping[str, Mapping[str, Entry]],
        base: Mapping[str, Mapping[str, Entry]] | None,
        changed: Iterable[tuple[str, str]],
    ) -> bytes:
        names = list(document)
        dicts = list(document.values())
        by_category: dict[str, list[str]] | None = None
        if base is not None:
            by_category = {}
            for category, key in changed:
                keys = by_category.get(category)
                if keys is None:
                    by_category[category] = [key]
                else:
                    keys.append(key)
        categories = self._categories
        if names == self._names:
            # The usual write: the same categories in the same order, one or two of them new dicts.
            categories = list(categories)
            by_name = self._by_name
            for i in compress(count(), map(operator.is_not, dicts, map(_ENTRIES, categories))):
                categories[i] = by_name[names[i]] = self._category(categories[i], names[i], dicts[i], base, by_category)
        else:
            by_name = self._by_name
            categories = []
            for name, entries in zip(names, dicts):
                kept = by_name.get(name)
                if kept is None or kept.entries is not entries:
                    kept = self._category(kept, name, entries, base, by_category)
                categories.append(kept)
            self._by_name = dict(zip(names, categories))
        pieces = [b"{\n  ", *chain.from_iterable(map(_PARTS, categories))]
        pieces[-1] = b"\n}\n"  # the last category's separator
        data = b"".join(pieces)
        self._names, self._categories = names, categories
        return data

    @staticmethod
    def _category(
        kept: _Category | None,
        name: str,
        entries: Mapping[str, Entry],
        base: Mapping[str, Mapping[str, Entry]] | None,
        by_category: dict[str, list[str]] | None,
    ) -> _Category:
        if kept is not None and base is not None and by_category is not None:
            keys = by_category.get(name)
            if keys is not None and base.get(name) is kept.entries and type(entries) is dict:
                return kept.patched(entries, keys)  # (a store's categories are dicts)
        return _Category(name, entries)


_ENTRIES = operator.attrgetter("entries")
_PARTS = operator.attrgetter("parts")
