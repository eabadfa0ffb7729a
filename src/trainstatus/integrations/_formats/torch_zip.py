"""Whether a torch checkpoint file (``torch.save``'s zip archive) is whole, from its structure alone.

``torch.save`` writes a zip archive: each member (``data.pkl``, ``version``, one per tensor
storage) is a 30-byte local header, the member's name, padding, then its bytes; after the last
member comes the central directory (each member's name, offset and size) and the end record.
``problem(path)`` checks, without reading any member's bytes:

- the end record and the central directory open (what ``zipfile.ZipFile`` reads when it opens a
  file: the last 22 bytes, the zip64 records when there are any, then the central directory);
- ``data.pkl`` and ``version`` are members (``torch.load`` needs both);
- at the offset the central directory gives for each member there is a local header (read: its
  30 bytes and its name, which must be the member's), and the member's bytes lie inside the file
  (offset + header + name + extra field + compressed size <= the file's size).

It reads O(members) bytes, however large the tensors: a few KB for a model of a few hundred
tensors, where a CRC check of every member (``ZipFile.testzip``) reads the whole file.

What it does not catch: bytes changed inside a member's data with the file's size kept (a bit
flipped on the disk, a program writing into the file in place); ``torch.load`` does not check the
members' CRCs either (checked with torch 2.13: zeroed bytes load as zeros). The integrations record a file
only after it was written completely and fsynced, with its size; a file cut short or grown since is
caught by that recorded size (``CheckpointList``'s own check), and a file torn by a kill before its
record is never listed. What the record protects against is a save that did not finish, not a disk
that changes bytes once written.
"""

from __future__ import annotations

import os
import struct
import zipfile
from typing import BinaryIO

__all__ = ["problem", "problem_in"]

_LOCAL = struct.Struct("<4s5HL2L2H")  # zipfile.structFileHeader: signature ... name length, extra length
_SIGNATURE = b"PK\x03\x04"
_UTF8 = 0x800  # general purpose flag bit 11: the name is UTF-8 (else cp437)
_NEEDED = ("data.pkl", "version")  # torch.load reads both; torch puts them under "<archive name>/"


def problem(path: str) -> str | None:
    """Why the file at ``path`` is not a whole torch checkpoint, or None (module docstring)."""
    # Unbuffered: each read below is one read of the bytes it asks for, not of a buffer's worth.
    with open(path, "rb", buffering=0) as f:
        return problem_in(f, os.fstat(f.fileno()).st_size)


def problem_in(f: BinaryIO, size: int) -> str | None:
    """``problem`` over an open file ``f`` of ``size`` bytes."""
    try:
        archive = zipfile.ZipFile(f)
    except (zipfile.BadZipFile, zipfile.LargeZipFile, OSError, ValueError, EOFError) as exc:
        return f"its zip central directory cannot be read ({exc})"
    with archive:
        infos = archive.infolist()
        missing = [name for name in _NEEDED if not any(info.filename.rsplit("/", 1)[-1] == name for info in infos)]
        if missing:
            return f"it has no {' and no '.join(missing)} member"
        for info in infos:
            why = _member_problem(f, info, size)
            if why is not None:
                return f"member {info.filename} {why}"
    return None


def _member_problem(f: BinaryIO, info: zipfile.ZipInfo, size: int) -> str | None:
    name = info.orig_filename.encode("utf-8" if info.flag_bits & _UTF8 else "cp437")
    if info.header_offset + _LOCAL.size + len(name) > size:
        return f"starts at byte {info.header_offset:,}, past the file's end ({size:,} bytes)"
    f.seek(info.header_offset)
    header = f.read(_LOCAL.size + len(name))
    if len(header) < _LOCAL.size + len(name):
        return f"starts at byte {info.header_offset:,}, which the file does not hold whole"
    fields = _LOCAL.unpack_from(header)
    if fields[0] != _SIGNATURE:
        return f"has no local header at byte {info.header_offset:,}, where the central directory puts it"
    name_length, extra_length = fields[-2], fields[-1]
    if header[_LOCAL.size:_LOCAL.size + name_length] != name:
        return f"has another name in its local header at byte {info.header_offset:,}"
    end = info.header_offset + _LOCAL.size + name_length + extra_length + info.compress_size
    if end > size:
        return f"ends at byte {end:,}, past the file's end ({size:,} bytes)"
    return None
