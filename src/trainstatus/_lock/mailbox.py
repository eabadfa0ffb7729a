"""Group commit across processes: a waiting process hands its ``set`` to the one holding the lock.

Eight processes setting keys of one file took turns, each writing and syncing the whole file
alone: together they wrote half as many sets per second as one process (issue 23). So a process
that must wait for the lock (``_lock.fair``: it signed in at slot ``s``) posts its changes in a box of
the lock file, past the waiting list: ``box_of(s)``. The process holding the lock, before it
writes its own changes, takes every box whose waiter still waits (``collect``), lays those changes
over its own, writes the file once, and only after that write is durable marks each box ``DONE``
(``acknowledge``), with an acknowledgement beside it: a CRC-32 of ``DONE``, the holder's pid and
the request it carried (the waiter's pid, arrival and payload checksum). A waiter that finds its
box ``DONE`` with the acknowledgement it computes itself returns without taking the lock: its
change is in a durable file, as if it had written it. Anything else and it writes itself, so a
holder that fails or dies costs time, never a change:

- ``PENDING``: posted. The holder turns it into ``CLAIMED`` (its own pid beside it) and the
  waiter, giving up (a timeout, Ctrl-C), into ``EMPTY``, each under an open-file-description lock
  on the box's claim byte, so exactly one of them wins.
- ``CLAIMED``: the holder is writing it. A waiter whose time runs out now waits for the outcome,
  as a thread of the same process does for its leader (``_group_commit``). A waiter that gets the
  lock and still finds it ``CLAIMED`` knows the holder failed or died and writes the change
  itself (a set of the same value twice leaves the file as once).
- ``DONE``: written and synced. The holder marks it so only if the box still holds the request
  it claimed: an interrupted waiter signs out, and another may post in its slot meanwhile. A
  ``DONE`` whose acknowledgement does not check (one byte written into the lock file, a torn box)
  is, to its waiter, ``CLAIMED``: perhaps taken, not known to be written (``Box.state``).

Whoever writes the lock file can write the status file too, so the acknowledgement is robustness,
not security: one byte written into the lock file, a tool writing into it, or a torn box can no
longer make a ``set`` return with nothing written; a process that computes it on purpose could, as
it could write the status file itself. The waiter goes by it alone, not by the status file it
reads afterwards: a value there other than its own does not say its change was not written
(another writer may have set the key since, or a later waiter in the same write).

Nobody waits for a claim byte: each side holds it for a read and a write (microseconds), but a
process stopped there (SIGSTOP, a debugger, Ctrl-Z) would hold it for the whole stop, and a wait in
``fcntl`` sees neither a deadline nor Ctrl-C. A holder that finds a box's byte taken passes that
box by (in ``collect``, and in ``acknowledge``, leaving it ``CLAIMED``): its waiter was posting or
taking it back, and writes its change itself. A waiter tries for ``_PATIENCE`` s, then does without:
it does not post, or it takes its request as perhaps taken (``CLAIMED``).

A box is the waiter's only while its slot holds its ``(pid, arrival)`` and its slot's byte is held
(``_lock.fair``): a box left behind by a process that died, or torn (its checksum fails), is never
taken. A holder takes only what it can write as its writer would have: a ``durable`` change only
into a durable write, and only from a store with the same metadata of its own (``meta``).
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import os
import struct
import time

TYPE_CHECKING = False  # typing.TYPE_CHECKING without importing typing (mypy takes it as True)
if TYPE_CHECKING:
    from .._codec.values import Entry

__all__ = ["BOX", "CLAIMED", "DONE", "EMPTY", "GONE", "PENDING", "Box", "Offer", "Request", "decode", "encode"]

EMPTY, PENDING, CLAIMED, DONE = 0, 1, 2, 3
GONE = -1  # as the waiter sees it: the box no longer holds its request (the lock file truncated)
# Another version of trainstatus, with another box format, leaves it alone (0x7E57B0C5: the
# head without the acknowledgement, whose holders would mark DONE with none).
_MAGIC = 0x7E57B0C6
# magic, state, pid, claimer, arrival, durable, length, crc32 of (pid, arrival, durable, payload),
# acknowledgement (0 until DONE; ``_ack``). The acknowledgement comes last, so the fields before it
# keep their offsets: the claim still writes state, pid and claimer at once.
_HEAD = struct.Struct("<IIIIqIIII")
_STATE_AT = 4
_ACK_AT = _HEAD.size - 4
_BASE = 4096  # past the waiting list (_lock.fair._SIZE) and the bytes its waiters lock
_CLAIM_BYTES = 2048  # the claim byte of box s is _CLAIM_BYTES + s (locked, never written)
# How long a waiter tries for its box's claim byte: held for microseconds by a process that runs,
# this covers one preempted on a loaded machine; past it the holder is stopped (see the module doc).
_PATIENCE = 0.05
BOX = 16384  # a box's size: a change that does not fit is written by its own process
_ITEM = struct.Struct("<IIIB")  # category, key, raw lengths; exotic


def box_of(slot: int) -> int:
    return _BASE + slot * BOX


def encode(changes: list[tuple[tuple[str, str], Entry]], meta: bytes) -> bytes | None:
    """The payload of a box: the store's own metadata, then each change (None: too big for a box)."""
    parts = [struct.pack("<II", len(meta), len(changes)), meta]
    size = _HEAD.size + 8 + len(meta)
    for (category, key), entry in changes:
        c = category.encode("utf-8", "surrogatepass")
        k = key.encode("utf-8", "surrogatepass")
        raw = entry[0]
        size += _ITEM.size + len(c) + len(k) + len(raw)
        if size > BOX:
            return None
        parts += (_ITEM.pack(len(c), len(k), len(raw), 1 if entry[1] else 0), c, k, raw)
    return b"".join(parts) if size <= BOX else None  # metadata alone may not fit (no change to stop at)


def decode(payload: bytes) -> tuple[bytes, list[tuple[tuple[str, str], Entry]]]:
    """``(meta, changes)`` of a payload ``encode`` made (checked by its checksum already)."""
    from .._codec.values import Entry  # loaded by every store already; not by _lock's importers

    meta_length, count = struct.unpack_from("<II", payload)
    at = 8 + meta_length
    meta = payload[8:at]
    changes: list[tuple[tuple[str, str], Entry]] = []
    for _ in range(count):
        c, k, r, exotic = _ITEM.unpack_from(payload, at)
        at += _ITEM.size
        category = payload[at:at + c].decode("utf-8", "surrogatepass")
        at += c
        key = payload[at:at + k].decode("utf-8", "surrogatepass")
        at += k
        changes.append(((category, key), Entry(payload[at:at + r], bool(exotic))))
        at += r
    return meta, changes


def _crc(pid: int, arrival: int, durable: int, payload: bytes) -> int:
    import binascii  # built in; only processes that hand over changes get here

    return binascii.crc32(payload, binascii.crc32(struct.pack("<Iqi", pid, arrival, durable)))


def _ack(claimer: int, pid: int, arrival: int, crc: int) -> int:
    """The acknowledgement a holder writes beside ``DONE``: bound to itself and to the request
    (``crc``: its checksum), so no leftover, stray or torn bytes pass for it."""
    import binascii

    return binascii.crc32(struct.pack("<IIIqI", DONE, claimer, pid, arrival, crc))


def _claim_lock(fd: int, slot: int, kind: int) -> None:
    """Lock (``F_WRLCK``) or let go of box ``slot``'s claim byte, never waiting: an OSError that
    ``_busy`` knows when another process holds it."""
    request = struct.pack("hhqqi4x", kind, os.SEEK_SET, _CLAIM_BYTES + slot, 1, 0)
    fcntl.fcntl(fd, fcntl.F_OFD_SETLK, request)


def _busy(exc: OSError) -> bool:
    return exc.errno in (errno.EAGAIN, errno.EACCES)


def _claim_patiently(fd: int, slot: int) -> None:
    """Lock the claim byte as a waiter: tried again for ``_PATIENCE`` s, then OSError (see the module doc)."""
    end = time.monotonic() + _PATIENCE
    while True:
        try:
            _claim_lock(fd, slot, fcntl.F_WRLCK)
            return
        except OSError as exc:
            if not _busy(exc) or time.monotonic() >= end:
                raise
        time.sleep(_PATIENCE / 100)


class Box:
    """A waiter's posted request: its slot's box in the lock file, as the waiter sees it."""

    def __init__(self, fd: int, slot: int, pid: int, arrival: int, crc: int) -> None:
        self.fd = fd  # a descriptor of the lock file whose open file description is the waiter's own
        self.slot = slot
        self.pid = pid
        self.arrival = arrival
        self.crc = crc  # the request's checksum, as posted: what a holder's acknowledgement binds

    @classmethod
    def post(cls, fd: int, slot: int, arrival: int, payload: bytes, *, durable: bool) -> Box:
        pid = os.getpid()
        flag = 1 if durable else 0
        crc = _crc(pid, arrival, flag, payload)
        head = _HEAD.pack(_MAGIC, PENDING, pid, 0, arrival, flag, len(payload), crc, 0)
        box = cls(fd, slot, pid, arrival, crc)
        _claim_patiently(fd, slot)
        try:
            os.pwrite(fd, head + payload, box_of(slot))
        finally:
            _claim_lock(fd, slot, fcntl.F_UNLCK)
        return box

    def state(self) -> int:
        """The box's state; GONE when it no longer holds this request: truncated away, maybe
        after a holder took it (so, as CLAIMED, it may be written). DONE only with the holder's
        acknowledgement of this very request; without it, CLAIMED (see the module doc)."""
        for _ in range(2):
            head = os.pread(self.fd, _HEAD.size, box_of(self.slot))
            if len(head) < _HEAD.size:
                return GONE
            magic, state, pid, claimer, arrival, _, _, _, ack = _HEAD.unpack(head)
            if magic != _MAGIC or pid != self.pid or arrival != self.arrival:
                return GONE
            if state != DONE or ack == _ack(claimer, pid, arrival, self.crc):
                return int(state)
            # Read once more: the kernel does not promise that a read sees a concurrent write
            # whole, and this one may have caught the DONE without the acknowledgement written
            # just before it (``acknowledge``); a second read after the DONE sees both.
        return CLAIMED

    def claimer(self) -> int:
        """The process that took the request (0: none, or unknown)."""
        head = os.pread(self.fd, _HEAD.size, box_of(self.slot))
        return int(_HEAD.unpack(head)[3]) if len(head) == _HEAD.size else 0

    def withdraw(self) -> int:
        """Take the request back if no holder took it: the state found (PENDING: taken back).
        OSError if it cannot tell: a holder may be taking it (its claim byte stayed taken)."""
        _claim_patiently(self.fd, self.slot)
        try:
            state = self.state()
            if state == PENDING:
                os.pwrite(self.fd, struct.pack("<I", EMPTY), box_of(self.slot) + _STATE_AT)
            return state
        finally:
            _claim_lock(self.fd, self.slot, fcntl.F_UNLCK)


class Offer:
    """What a waiting writer may hand over: ``request()`` is the payload, made when it is about to
    be posted (None: nothing to hand over); ``durable``, set by the storage, whether its write
    must be (a holder that does not sync leaves it)."""

    durable = True

    def request(self) -> bytes | None:
        raise NotImplementedError


class Request:
    """A box a holder took: the waiter's changes, to be acknowledged once written."""

    __slots__ = ("arrival", "changes", "crc", "pid", "slot")

    def __init__(self, slot: int, pid: int, arrival: int, crc: int,
                 changes: list[tuple[tuple[str, str], Entry]]) -> None:
        self.slot = slot
        self.pid = pid
        self.arrival = arrival
        self.crc = crc
        self.changes = changes


def collect(fd: int, waiters: list[tuple[int, int, int]], *, meta: bytes, durable: bool) -> list[Request]:
    """Claim the pending box of each waiter ``(slot, pid, arrival)`` that this write can carry.

    ``fd``: the holder's descriptor of the lock file (its flock held). Oldest waiter first. A box
    whose claim byte is taken is passed by; an error stops the collection: what is taken so far
    is written; the others write their own.
    """
    taken: list[Request] = []
    for slot, pid, arrival in waiters:
        try:
            _claim_lock(fd, slot, fcntl.F_WRLCK)
        except OSError as exc:
            if _busy(exc):
                continue  # its waiter is posting or taking it back (or stopped there): it writes its own
            break
        try:
            request = _claim(fd, slot, pid, arrival, meta=meta, durable=durable)
        except OSError:
            break
        finally:
            with contextlib.suppress(OSError):
                _claim_lock(fd, slot, fcntl.F_UNLCK)
        if request is not None:
            taken.append(request)
    return taken


def _claim(fd: int, slot: int, pid: int, arrival: int, *, meta: bytes, durable: bool) -> Request | None:
    """The request in box ``slot`` if this write can carry it, marked CLAIMED (claim byte held)."""
    data = os.pread(fd, BOX, box_of(slot))
    if len(data) < _HEAD.size:
        return None
    magic, state, box_pid, _, box_arrival, flag, length, crc, _ = _HEAD.unpack_from(data)
    if (magic != _MAGIC or state != PENDING or (box_pid, box_arrival) != (pid, arrival)
            or length > len(data) - _HEAD.size or (flag and not durable)):
        return None
    payload = data[_HEAD.size:_HEAD.size + length]
    if _crc(pid, arrival, flag, payload) != crc:
        return None  # torn, or not a box at all: its waiter writes it itself
    try:
        box_meta, changes = decode(payload)
    except (ValueError, struct.error):  # a checksum that matches by chance (UnicodeDecodeError too)
        return None
    if box_meta != meta:
        return None
    # state, pid, claimer in one write: a failed one leaves the box PENDING
    os.pwrite(fd, struct.pack("<III", CLAIMED, pid, os.getpid()), box_of(slot) + _STATE_AT)
    return Request(slot, pid, arrival, crc, changes)


def acknowledge(fd: int, requests: list[Request]) -> None:
    """Mark each request written (after the write that carried them is durable).

    Only a box that still holds the request as this process claimed it: its waiter, interrupted
    meanwhile, may have signed out, and another waiter posted its own request in that slot,
    which this write did not carry.
    """
    done = struct.pack("<I", DONE)
    me = os.getpid()
    for request in requests:
        try:
            _claim_lock(fd, request.slot, fcntl.F_WRLCK)
        except OSError as exc:
            # Its waiter, finding it not DONE once it has the lock, writes it again. A busy byte:
            # that waiter is giving up (or another posting in its slot), maybe stopped there.
            if _busy(exc):
                continue
            return
        try:
            head = os.pread(fd, _HEAD.size, box_of(request.slot))
            if len(head) == _HEAD.size:
                magic, state, pid, claimer, arrival, _, _, crc, _ = _HEAD.unpack(head)
                if (magic, state, pid, claimer, arrival, crc) == (
                        _MAGIC, CLAIMED, request.pid, me, request.arrival, request.crc):
                    # Two writes, the acknowledgement first: a waiter that reads DONE then finds
                    # the acknowledgement already there. One write of both would not do (they are
                    # not side by side, and a concurrent read need not see even one write whole);
                    # a failure between the two leaves the box CLAIMED, which its waiter writes.
                    ack = _ack(me, request.pid, request.arrival, request.crc)
                    os.pwrite(fd, struct.pack("<I", ack), box_of(request.slot) + _ACK_AT)
                    os.pwrite(fd, done, box_of(request.slot) + _STATE_AT)
        except OSError:
            return
        finally:
            with contextlib.suppress(OSError):
                _claim_lock(fd, request.slot, fcntl.F_UNLCK)

