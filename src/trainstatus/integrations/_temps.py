"""Temp files a killed save left behind, removed when a callback or plugin starts on a folder."""

from __future__ import annotations

import os
import re


def remove_stale_temps(folder: str, pattern: re.Pattern[str]) -> None:
    """Remove the files of ``folder`` whose names match ``pattern`` (temp files that never became
    checkpoints); a folder that cannot be listed, or a file already gone, is left to the next run."""
    try:
        names = os.listdir(folder)
    except OSError:
        return
    for name in names:
        if pattern.fullmatch(name):
            try:
                os.remove(os.path.join(folder, name))
            except OSError:
                pass
