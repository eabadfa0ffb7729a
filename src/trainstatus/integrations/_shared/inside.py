"""Whether a status file would lie inside a checkpoint folder, which every integration refuses: a
save into that folder writes around the status file (or over it), and a rotation that removes the
folder takes the status file, the whole list, with it."""

from __future__ import annotations

import os
from collections.abc import Callable

__all__ = ["inside"]


def inside(status_path: str, folder: str | None = None, *, named: Callable[[str], bool] | None = None,
           under: str | None = None, look: Callable[[str], bool] | None = None) -> str | None:
    """The checkpoint folder the status file ``status_path`` (absolute) would lie inside, or None:

    - ``folder`` (absolute), the one being saved or read, when the status file is in it or below;
    - else the nearest folder above the status file, and below ``under`` (absolute: the folder the
      library saves its checkpoint folders in; None: any, for names no user's folder has, as Ray's),
      whose name ``named`` says a checkpoint's is (``checkpoint-12``, ``last.ckpt``): from the path
      alone (a local path or a URL), so the same on every rank, and safe before a collective (a
      folder of the same name above ``under`` is the user's own);
    - else, with ``look``, the folder holding the status file when ``look`` finds a checkpoint
      there on this host's disk (rank 0's to say, under ranks: another host may see another disk).
    """
    parent = os.path.dirname(status_path)
    if folder is not None and (parent == folder or parent.startswith(folder + os.sep)):
        return folder
    if named is not None and (under is None or parent.startswith(under + os.sep)):
        above = parent
        while above != under and os.path.dirname(above) != above:
            if named(os.path.basename(above)):
                return above
            above = os.path.dirname(above)
    if look is not None and look(parent):
        return parent
    return None
