"""The crash model: every state a power loss after each prefix of a trace may leave.

A power loss after the first *k* operations of a trace, for every *k* from 0 (nothing done) to
the end (the run returned), may leave any state these rules allow:

1. Each directory's operations persist in program order: the disk holds a prefix of them, for
   each directory independently of the others. An ``fsync`` of a directory makes the earlier
   operations on that directory durable, and those of no other directory: a new ``models/``
   folder's files may be lost although ``run_logs/`` was synced after them, and a folder's files
   are lost with its own entry (until its parent is synced). A rename or link between two
   directories belongs to both: it persists in both or in neither. A directory is followed
   through its renames. (POSIX promises no more; ext4's journal often gives more, but a test
   should not rely on it.)
2. File data and permission bits do not follow the directory. A write, truncate or chmod of a
   file is durable once an ``fsync`` of that file followed it; each one that was not followed by
   one may be missing, independently of the others (so they may also appear reordered), and a
   write may be torn at ``BLOCK`` (512-byte sector) granularity: any subset of its blocks (every
   subset up to 6 blocks; beyond that every prefix and every one-block hole), the other blocks
   holding what was there before, or zeros where the file grew; or the file may end after the
   last block that made it; or the file may have grown to its new size with only zeros in the
   new part (size persisted, data not: what delayed allocation leaves).
3. Nothing else: durable data is not corrupted, a file's bytes come from no other file, the disk
   does not lie about fsync. Lock files hold no content and are left out.

A file created by the trace starts with no bytes and the permission bits it was created with.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Iterator
from typing import Any

from .fs import FsState
from .record import DIRECTORY_OPS, FILE_OPS, Op, apply_directory_op, apply_file_op, parent_of, write_bytes

__all__ = ["BLOCK", "crash_states", "write_outcomes"]

BLOCK = 512
ALL_SUBSETS_UP_TO = 6  # blocks in one write; beyond that, prefixes and one-block holes only


def _blocks(offset: int, length: int, block: int) -> list[tuple[int, int]]:
    """The write's range cut at multiples of ``block``: (start, end) file offsets."""
    cuts, start, end = [], offset, offset + length
    while start < end:
        stop = min(end, (start // block + 1) * block)
        cuts.append((start, stop))
        start = stop
    return cuts


def _torn(content: bytes, op: Op, applied: tuple[int, ...], blocks: list[tuple[int, int]], grow_to: int) -> bytes:
    out = bytearray(content)
    if len(out) < grow_to:
        out.extend(bytes(grow_to - len(out)))
    for i in applied:
        start, stop = blocks[i]
        out[start:stop] = op.data[start - op.offset: stop - op.offset]
    return bytes(out)


def write_outcomes(content: bytes, op: Op, block: int = BLOCK) -> list[bytes]:
    """What an unsynced write may have left of ``content`` (rule 2 of the model)."""
    end = op.offset + len(op.data)
    outcomes = [content, write_bytes(content, op.offset, op.data)]
    if end > len(content):
        outcomes.append(content + bytes(end - len(content)))  # size persisted, data not
    blocks = _blocks(op.offset, len(op.data), block)
    n = len(blocks)
    if n >= 2:
        if n <= ALL_SUBSETS_UP_TO:
            subsets = [s for r in range(1, n) for s in itertools.combinations(range(n), r)]
        else:
            subsets = [tuple(range(j)) for j in range(1, n)] + [tuple(i for i in range(n) if i != hole) for hole in range(n)]
        for subset in subsets:
            outcomes.append(_torn(content, op, subset, blocks, max(len(content), end)))
            last = blocks[max(subset)][1]
            if subset == tuple(range(len(subset))) and last < end and last > len(content):
                outcomes.append(_torn(content, op, subset, blocks, last)[: max(len(content), last)])
    return outcomes


def _file_outcomes(base: tuple[bytes, int], durable: list[Op], volatile: list[Op], block: int) -> list[tuple[bytes, int]]:
    content, mode = base
    for op in durable:
        content, mode = apply_file_op(content, mode, op)
    results = {(content, mode)}
    for op in volatile:
        grown = set()
        for content, mode in results:
            if op.kind == "write":
                for outcome in write_outcomes(content, op, block):
                    grown.add((outcome, mode))
            else:
                grown.add((content, mode))
                grown.add(apply_file_op(content, mode, op))
        results = grown
    return sorted(results)


def _directories_of(initial: FsState, ops: list[Op]) -> list[tuple[int, ...]]:
    """For each operation, the directories (by identity) whose entries it changes or, for a
    ``dirsync``, the one it syncs; () for file operations.

    A directory is followed through renames, so an fsync of ``final`` covers what was done in it
    while it was still called ``tmp``. A rename or a link belongs to both directories it touches.
    """
    fresh = itertools.count()
    ids = {rel: next(fresh) for rel, (kind, _) in [("", ("dir", 0)), *initial.entries.items()] if kind == "dir"}

    def of(rel: str) -> int:
        if rel not in ids:  # a directory neither there before nor made by the trace: its own
            ids[rel] = next(fresh)
        return ids[rel]

    result: list[tuple[int, ...]] = []
    for op in ops:
        if op.kind == "dirsync":
            result.append((of(op.rel),))
        elif op.kind in ("rename", "link"):
            result.append(tuple(sorted({of(parent_of(op.rel)), of(parent_of(op.dest))})))
            if op.kind == "rename" and op.rel in ids:  # a directory: its tree keeps its identities
                for rel in [r for r in ids if r == op.dest or r.startswith(op.dest + os.sep)]:
                    del ids[rel]
                for rel in [r for r in ids if r == op.rel or r.startswith(op.rel + os.sep)]:
                    ids[op.dest + rel[len(op.rel):]] = ids.pop(rel)
        elif op.kind in DIRECTORY_OPS:
            result.append((of(parent_of(op.rel)),))
            if op.kind == "mkdir":
                ids[op.rel] = next(fresh)
        else:
            result.append(())
    return result


def _durable_directory_ops(prefix: list[Op], directories: list[tuple[int, ...]]) -> Iterator[list[int]]:
    """Every set of the prefix's directory operations a power loss may leave (rule 1), in order.

    Each directory keeps a prefix of its own operations (at least up to its last ``dirsync``);
    an operation that belongs to two directories (a rename) is in both prefixes or in neither.
    """
    chains: dict[int, list[int]] = {}
    for i, op in enumerate(prefix):
        if op.kind in DIRECTORY_OPS:
            for d in directories[i]:
                chains.setdefault(d, []).append(i)
    lower = dict.fromkeys(chains, 0)
    for j, op in enumerate(prefix):
        if op.kind == "dirsync" and directories[j][0] in chains:
            chain = chains[directories[j][0]]
            lower[directories[j][0]] = max(lower[directories[j][0]], sum(1 for i in chain if i < j))
    order = sorted(chains)
    for lengths in itertools.product(*(range(lower[d], len(chains[d]) + 1) for d in order)):
        kept: dict[int, int] = {}  # operation -> how many of its directories keep it
        for d, length in zip(order, lengths):
            for i in chains[d][:length]:
                kept[i] = kept.get(i, 0) + 1
        if all(count == len(directories[i]) for i, count in kept.items()):
            yield sorted(kept)


def _unreachable(entries: dict[str, tuple[str, Any]]) -> list[str]:
    """Names whose directory is not there (made in a directory whose own entry was lost)."""
    def reachable(rel: str) -> bool:
        parent = parent_of(rel)
        return parent == "" or (entries.get(parent, ("",))[0] == "dir" and reachable(parent))
    return [rel for rel in entries if not reachable(rel)]


def crash_states(initial: FsState, ops: list[Op], block: int = BLOCK) -> Iterator[tuple[int, FsState]]:
    """Every (k, state) the model allows for a power loss after the first k operations."""
    directories = _directories_of(initial, ops)
    for k in range(len(ops) + 1):
        prefix = ops[:k]
        for durable_ops in _durable_directory_ops(prefix, directories):
            names = FsState(dict(initial.entries), dict(initial.files))
            for i in durable_ops:
                apply_directory_op(names, prefix[i])
            for rel in _unreachable(names.entries):
                del names.entries[rel]
            reachable = sorted({ref for kind, ref in names.entries.values() if kind == "file"})
            choices = []
            for inode in reachable:
                file_ops = [(i, op) for i, op in enumerate(prefix) if op.inode == inode and op.kind in FILE_OPS]
                syncs = [i for i, op in enumerate(prefix) if op.inode == inode and op.kind == "fsync"]
                data_syncs = [i for i, op in enumerate(prefix) if op.inode == inode and op.kind == "fdatasync"]
                last_sync = max(syncs, default=-1)
                last_data_sync = max(data_syncs + syncs, default=-1)
                durable: list[Op] = []
                volatile: list[Op] = []
                for i, op in file_ops:
                    limit = last_sync if op.kind == "chmod" else last_data_sync
                    (durable if i < limit else volatile).append(op)
                choices.append(_file_outcomes(names.files[inode], durable, volatile, block))
            for combination in itertools.product(*choices):
                state = FsState(dict(names.entries), dict(names.files))
                for inode, outcome in zip(reachable, combination):
                    state.files[inode] = outcome
                yield k, state
