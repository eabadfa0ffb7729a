"""The resume decision of ``trainstatus.integrations.lightning``: the newest recorded checkpoint of a
``ModelCheckpoint`` folder that is whole (a local folder read through ``CheckpointList`` and the
checks of ``common.whole``; an object store's through ``remote.newest``), taken by rank 0 and the
same on every rank (``_ranks.resuming.decide``), with the warnings that name what it passed over."""

from __future__ import annotations

import os
from typing import Any

from ..._errors import TrainingStatusCheckpointWarning, warn
from .._ranks import resuming as _resuming
from .._shared.choice import pick, warn_passed_over
from . import remote
from .common import CATEGORY, WORDS, status_path, unrecorded, whole
from .strategies import Resumed

__all__ = ["decide"]

def decide(given: Resumed, timeout: float | None, shown: str | None = None) -> tuple[str | None, str]:
    """The name of the checkpoint to resume from in ``given.folder`` (``_resuming.decide``: rank 0
    reads), and the folder as it is shown."""
    shown = given.folder if shown is None else shown
    if remote.is_remote(given.folder):  # every host reads the same store: nothing to check per host
        def newest() -> str | None:  # rank 0's: its error (a checkpoint given for its folder) reaches every rank
            remote.refuse_checkpoint_given(given.folder)
            return remote.newest(given.folder, given.status_path, WORDS)

        name = _resuming.decide(newest, lambda _: {},
                                given.folder, what=f"the newest complete checkpoint of {shown}", timeout=timeout)
        return name, shown.rstrip("/")
    folder, path = given.folder, given.status_path or status_path(given.folder, None)

    def choose() -> dict[str, Any] | None:
        listed: list[Any] = []
        entry, skipped = pick(path, CATEGORY, folder, whole(folder), listed)
        if skipped:
            returned = None if entry is None else os.path.join(shown, entry["file_path"])
            warn_passed_over(returned, skipped, path, CATEGORY, folder, WORDS)
        said = unrecorded(folder, path, listed)
        if said is not None:
            warn(TrainingStatusCheckpointWarning(said, path=path, category=CATEGORY))
        return entry

    entry = _resuming.decide(choose, _resuming.entry_files, folder,
                             what=f"the newest complete checkpoint of {shown}", timeout=timeout)
    return (None if entry is None else entry["file_path"]), shown
