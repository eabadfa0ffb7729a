"""``_Pin``: an open descriptor on the version of a local file last read or written.

While it is open the version's inode cannot be freed and its number reused by a later file, so
(inode, size, mtime) stays a reliable sign of whether anyone replaced the file since
(``atomic.write_atomic``). When and by which thread the descriptors our own writes replaced are
closed is the pin's concern alone, so it has its own module; ``local.LocalFile`` holds one pin. It
imports the lock module's descriptor helpers (``_lock.descriptor``) and the background closer
(``closer``).
"""

from __future__ import annotations

import os

from .closer import _closer
from .._lock import descriptor as _descriptor

__all__ = ["_Pin"]


class _Pin:
    """An open descriptor on the file version last read or written (see ``write_atomic``).

    A pin replaced by our own write is *retired*, not closed at once: once this thread releases
    the lock, retired pins go to the background ``_closer`` (see there why), except those whose
    version the write kept in the history (``linked``): closing them frees nothing, so this
    thread closes them itself.

    Each descriptor is kept with the ``os.close`` of the ``os`` that opened it (``_descriptor.Descriptor``).
    """

    def __init__(self) -> None:
        self._current: _descriptor.Descriptor | None = None
        self.retired: list[_descriptor.Descriptor] = []
        self.linked: list[_descriptor.Descriptor] = []  # retired, their inode kept by a history link

    @property
    def fd(self) -> int | None:
        return None if self._current is None else self._current[0]

    def set(self, fd: int | None) -> None:
        old, self._current = self._current, None if fd is None else (fd, os.close)
        if old is not None:
            _descriptor.close_all([old])

    def replace(self, fd: int, *, linked: bool = False) -> None:
        """Pin ``fd`` and retire the previous pin (closed later by ``close_retired``); ``linked``:
        its version has a name in the history, so closing it frees no inode."""
        old, self._current = self._current, (fd, os.close)
        if old is not None:
            (self.linked if linked else self.retired).append(old)

    @property
    def pending(self) -> bool:
        """Whether retired pins wait for ``close_retired``."""
        return bool(self.retired or self.linked)

    def close_retired(self) -> None:
        _descriptor.close_all(self.linked)
        retired, self.retired = self.retired, []
        if retired:
            _closer.close(retired)

    def close(self) -> None:
        self.set(None)
        _descriptor.close_all(self.linked)
        _descriptor.close_all(self.retired)  # at once: a closed store holds nothing open
