"""DeepSpeed's ``latest`` file, kept true for DeepSpeed's own tools (``zero_to_fp32.py``, a bare
``engine.load_checkpoint(dir)``), which read it; trainstatus never does.

DeepSpeed writes ``latest`` with ``open(..., "w")`` on rank 0 while the other ranks may still be
writing their shards, with no fsync: a kill leaves it empty, or naming a tag that is not whole. Here
it is written only after the tag's record is on disk (so it names a whole tag), as a new file
renamed over the old one and fsynced with its folder (so it is never empty nor half written), and
removed before a tag it names is saved over (so it never names a folder being rewritten).
"""

from __future__ import annotations

import os

from ..._storage.atomic import sync_directory, write_atomic

__all__ = ["LATEST", "forget", "name"]

LATEST = "latest"


def name(root: str, tag: str) -> None:
    """Make ``root/latest`` name ``tag``, atomically and durably."""
    fd, _ = write_atomic(os.path.join(root, LATEST), tag.encode(), durable=True, mode=0o644)
    os.close(fd)


def forget(root: str, tag: str) -> None:
    """Remove ``root/latest`` (durably) if it names ``tag``, which is about to be saved over."""
    path = os.path.join(root, LATEST)
    try:
        with open(path, "rb") as f:
            named = f.read(4096).strip()
    except OSError:
        return
    if named == tag.encode():
        os.remove(path)
        sync_directory(root)
