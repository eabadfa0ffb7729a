"""The cached render (``_codec.renderer.Renderer``): byte for byte ``_codec.document.render``,
whatever the order of changes, failed writes, reloads and interruptions, and never a kept piece
that is out of date."""

from __future__ import annotations

import json
import random
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest

from trainstatus import StatusStore
from trainstatus._codec import renderer as _render
from trainstatus._codec.document import render
from trainstatus._codec.encoding import encode_loaded
from trainstatus._codec.values import Entry
from trainstatus._document import apply  # what the store does to make the next document
from trainstatus._codec.renderer import Renderer

Document = dict[str, dict[str, Entry]]
Pending = dict[tuple[str, str], "Entry | None"]


@pytest.fixture(autouse=True)
def _strict(monkeypatch: pytest.MonkeyPatch) -> None:
    # An error inside the renderer must fail the test, not be covered by the uncached fallback.
    monkeypatch.setattr(Renderer, "fallback", False)




def value(rng: random.Random) -> Entry:
    kind = rng.randrange(5)
    if kind == 0:
        return encode_loaded(rng.randrange(-1000, 1000))
    if kind == 1:
        return encode_loaded({"steps": rng.randrange(10**6), "reward": rng.choice([None, 1.5, float("nan")])})
    if kind == 2:
        return encode_loaded([rng.random() for _ in range(rng.randrange(4))])
    if kind == 3:
        return encode_loaded("x" * rng.randrange(0, 300))  # some pieces over JOIN_BELOW when it is small
    return encode_loaded({})


def changes(rng: random.Random, document: Document, names: list[str]) -> Pending:
    pending: Pending = {}
    for _ in range(rng.choice([1, 1, 1, 2, 5, 40])):
        category = rng.choice(names)
        existing = list(document.get(category, {}))
        if existing and rng.random() < 0.7:
            key = rng.choice(existing)  # a key that is there: replaced or deleted
        else:
            key = f"k{rng.randrange(200)}"
        pending[(category, key)] = None if rng.random() < 0.25 else value(rng)
    return pending


@pytest.mark.parametrize("chunk", [1, 3, 8])
def test_random_changes_render_byte_for_byte(monkeypatch: pytest.MonkeyPatch, seed: int, chunk: int) -> None:
    """Against the uncached render after every step of random sets and deletes, with small chunks
    so that big categories, appends past a chunk's end and emptied chunks all happen; some writes
    fail (the store keeps its old document), some documents are read again (new dicts, maybe other
    contents), some renders come without the hint."""
    monkeypatch.setattr(_render, "CHUNK", chunk)
    monkeypatch.setattr(_render, "JOIN_BELOW", random.Random(seed).choice([0, 64, 1 << 16]))
    rng = random.Random(seed)
    names = [f"cat{i}" for i in range(6)] + ["metadata"]
    renderer = Renderer()
    document: Document = {}
    for step in range(600):
        pending = changes(rng, document, names)
        new = apply(document, pending)
        roll = rng.random()
        if roll < 0.1:
            got = renderer.render(new)  # no hint: touched categories are built whole
        else:
            got = renderer.render(new, document, pending)
        assert got == render(new), f"step {step}"
        if roll < 0.2 and 0.1 <= roll:
            continue  # the write failed: the store keeps the document it had
        document = new
        if rng.random() < 0.05:  # read again from the file: equal values, every dict a new one
            document = {name: dict(entries) for name, entries in document.items()}
        if rng.random() < 0.03:  # another process wrote: other contents under the same names
            document = apply(document, changes(rng, document, names))
            document = {name: dict(entries) for name, entries in document.items()}


def test_a_stale_piece_is_never_served() -> None:
    """Each way a kept piece goes out of date: the dict rendered last is not the base (a failed
    write), the base is the same but names the same key with another value (a reload), a category
    comes back after being removed."""
    renderer = Renderer()
    one, two, three = encode_loaded(1), encode_loaded(2), encode_loaded(3)
    big = {f"k{i}": one for i in range(2 * _render.CHUNK + 5)}
    d0: Document = {"a": dict(big), "b": {"x": one}}
    assert renderer.render(d0) == render(d0)
    # A write that failed: d1 rendered, never adopted; d2 made from d0 again.
    d1 = apply(d0, {("a", "k3"): two})
    assert renderer.render(d1, d0, {("a", "k3"): two}) == render(d1)
    far = f"k{_render.CHUNK + 3}"  # in another chunk than k3
    d2 = apply(d0, {("a", far): three})
    assert renderer.render(d2, d0, {("a", far): three}) == render(d2)  # k3 must be 1 again
    # Read again: another writer set k7 to 2; the new dicts are the base of the next write.
    reread = {"a": {**d2["a"], "k7": two}, "b": dict(d2["b"])}
    d3 = apply(reread, {("a", far): two})
    assert renderer.render(d3, reread, {("a", far): two}) == render(d3)  # k7 must be 2
    # A category removed and back with the same object layout but other values.
    d4 = apply(d3, {("b", "x"): None})
    assert renderer.render(d4, d3, {("b", "x"): None}) == render(d4)
    d5 = apply(d4, {("b", "x"): two})
    assert renderer.render(d5, d4, {("b", "x"): two}) == render(d5)


def test_an_interrupted_render_forgets_what_it_kept(monkeypatch: pytest.MonkeyPatch) -> None:
    """A render interrupted after it changed the key -> chunk index (a delete) must not leave that
    index to the next write."""
    renderer = Renderer()
    one, two = encode_loaded(1), encode_loaded(2)
    d0: Document = {"a": {f"k{i}": one for i in range(3 * _render.CHUNK)}}
    renderer.render(d0)
    d1 = apply(d0, {("a", "k2"): two})
    assert renderer.render(d1, d0, {("a", "k2"): two}) == render(d1)  # the index is made and kept
    real = _render._Chunk.__init__

    def interrupted(self: Any, *args: Any) -> None:
        real(self, *args)
        raise KeyboardInterrupt

    monkeypatch.setattr(_render._Chunk, "__init__", interrupted)
    with pytest.raises(KeyboardInterrupt):
        renderer.render(apply(d1, {("a", "k1"): None}), d1, {("a", "k1"): None})
    monkeypatch.setattr(_render._Chunk, "__init__", real)
    d2 = apply(d1, {("a", "k1"): two})  # the write failed: k1 is still there, and changes
    assert renderer.render(d2, d1, {("a", "k1"): two}) == render(d2)


def test_a_second_thread_gets_the_uncached_render() -> None:
    renderer = Renderer()
    document: Document = {"a": {"k": encode_loaded(1)}}
    renderer._lock.acquire()
    try:
        assert renderer.render(document) == render(document)
        assert renderer._names == []  # nothing kept from a render that did not hold the lock
    finally:
        renderer._lock.release()


def test_the_store_writes_what_the_uncached_render_would(tmp_path: Any, seed: int) -> None:
    """Through a real store and file: every write's bytes are the document in render's layout."""
    rng = random.Random(seed)
    path = tmp_path / "status.json"
    model: dict[str, dict[str, Any]] = {}
    with StatusStore(path, durable=False, history=0) as store:
        for _ in range(150):
            category, key = f"c{rng.randrange(3)}", f"k{rng.randrange(700)}"
            if rng.random() < 0.2 and key in model.get(category, {}):
                store.delete(category, key)
                del model[category][key]
                if not model[category]:
                    del model[category]
            else:
                item = rng.randrange(10**6)
                store.set(category, key, item)
                model.setdefault(category, {})[key] = item
            data = path.read_bytes()
            parsed = json.loads(data)
            assert {k: v for k, v in parsed.items() if k != "metadata"} == model
            assert data == orjson.dumps(parsed, option=orjson.OPT_INDENT_2) + b"\n"


def test_a_forked_child_renders_with_its_own_cache_lock(tmp_path: Path) -> None:
    # As if another thread of the parent were rendering at the fork: its lock held, what it kept
    # possibly half updated. The child must neither keep the lock (every write uncached) nor trust
    # what was kept.
    import os

    store = StatusStore(tmp_path / "status.json")
    store.set("a", "x", 1)
    renderer = store._renderer  # type: ignore[attr-defined]
    assert renderer._lock.acquire(blocking=False)
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child reports through its exit status
        code = 1
        try:
            store.set("a", "y", 2)
            code = 0 if renderer._lock.acquire(blocking=False) and renderer._names == ["a", "metadata"] else 3
        finally:
            os._exit(code)
    renderer._lock.release()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    store.close()
