"""Whether a ``.safetensors`` file is whole, from its header alone.

A safetensors file is an 8-byte little-endian header length, the header (JSON: each tensor's dtype,
shape and ``data_offsets`` within the data that follows), then the data. ``problem(path)`` reads the
first 8 bytes and the header, never the tensors: the header must be JSON (UTF-8, as the format
says) and account for the file's length (the last tensor ends where the file ends). A save a kill
cut short fails that; a file recorded with its size after its fsync is what was written.
"""

from __future__ import annotations

import json
import os
import struct

__all__ = ["problem"]


def problem(path: str) -> str | None:
    """Why the file at ``path`` is not a whole safetensors file, or None (module docstring)."""
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            return "is too short for a safetensors header"
        (length,) = struct.unpack("<Q", head)
        size = os.fstat(f.fileno()).st_size
        if length > size - 8:
            return f"its header claims {length:,} bytes, the file has {size:,}"
        try:
            header = json.loads(f.read(length).decode("utf-8"))
        except ValueError as exc:  # UnicodeDecodeError too
            return f"its header is not JSON ({exc})"
    if not isinstance(header, dict):
        return "its header is not a JSON object"
    try:
        ends = [int(t["data_offsets"][1]) for key, t in header.items() if key != "__metadata__"]
    except (TypeError, KeyError, IndexError, ValueError):
        return "its header has a tensor without data_offsets"
    end = 8 + length + max(ends, default=0)
    if end != size:
        return f"its tensors end at byte {end:,}, the file has {size:,}"
    return None
