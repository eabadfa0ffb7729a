"""Hugging Face Accelerate: every process's files of a save durable before it is recorded, and one
resume, from the newest complete checkpoint, for every process.

``accelerator.save_state()`` has every process write into the checkpoint folder (the main process
the model, optimizer, scheduler and registered objects; each process its ``random_states_<i>.pkl``;
under FSDP and DeepSpeed each its shards), with no barrier after; with automatic checkpoint naming
and ``total_limit`` it removes the oldest folder *before* writing the new one; and
``accelerator.load_state()`` takes the highest-numbered ``checkpoint_<n>``, complete or not, and
leaves the save counter where it was. Here, three calls in place of Accelerate's two:

- ``save_state(accelerator)``: Accelerate's save, its rotation turned off for the call; then every
  process fsyncs what it sees of the folder, and once every process's save returned, the main
  process records the folder (every file with its size, and the number of processes) in
  ``training_status.json``; ``total_limit`` is applied after that record, never to the newest.
- ``load_state(accelerator)``: the main process chooses the newest recorded folder that is whole,
  every process checks it sees it, and every process loads that one, with Accelerate's save counter
  set after it.
- ``last_complete_checkpoint(directory)``: that choice alone, as a path.

Usage (two lines differ from Accelerate's own)::

    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration
    from trainstatus.integrations.accelerate import load_state, save_state

    accelerator = Accelerator(project_config=ProjectConfiguration(
        project_dir="runs/a", automatic_checkpoint_naming=True, total_limit=3))
    model, optimizer = accelerator.prepare(model, optimizer)
    load_state(accelerator)                      # was: accelerator.load_state()
    for batch in data:
        ...
        save_state(accelerator)                  # was: accelerator.save_state()
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Mapping
from typing import Any

from accelerate import Accelerator

from .._checkpoints.checkpoint_list import CheckpointList
from .._errors import (
    TrainingStatusCheckpointError,
    TrainingStatusCheckpointWarning,
    TrainingStatusError,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    warn,
)
from .._storage import history as _history
from .._store import StatusStore
from ._accelerate import places as _places
from ._accelerate.folders import sweep, unrecorded, whole
from ._formats.deepspeed_tags import refusal
from ._accelerate.places import PathLike, Place, project, refuse_misplaced, saving, shown_path
from ._accelerate.places import place as _place
from ._ranks import hosts as _hosts
from ._ranks import resuming as _resuming
from ._ranks import saving as _saving
from ._shared import lease as _lease
from ._shared.choice import Words, choose, warn_passed_over
from ._shared.upkeep import drop

__all__ = ["CATEGORY", "STATUS_FILE", "last_complete_checkpoint", "load_state", "save_state"]

STATUS_FILE = _places.STATUS_FILE
"""The status file's name: in ``project_dir`` with automatic checkpoint naming (beside
``checkpoints/``, never in it), else in the folder that holds the checkpoint folders."""

CATEGORY = _places.CATEGORY
"""The category of the status file the checkpoints are listed under (``accelerate/checkpoints``)."""

_WORDS = Words(
    left="They are left as they are: this run's save_state() unlists each before it saves over its folder.",
    fresh="load_state() loads nothing and the run starts from scratch; its save_state() unlists them and "
          "saves over their folders as Accelerate's save counter reaches them.",
    elsewhere="give Accelerate another project_dir (or save into another folder)",
)


def save_state(accelerator: Accelerator, output_dir: PathLike | None = None, **kwargs: Any) -> str:
    """``accelerator.save_state(output_dir, **kwargs)``, recorded once every process's files are
    durable; returns the checkpoint folder (what Accelerate returns, as a str).

    Call it on every process, where you call ``accelerator.save_state``. With automatic checkpoint
    naming (``ProjectConfiguration(automatic_checkpoint_naming=True)``) Accelerate saves into
    ``<project_dir>/checkpoints/checkpoint_<n>`` (``n``: its save counter,
    ``accelerator.project_configuration.iteration``) and the status file is
    ``<project_dir>/training_status.json``; otherwise it saves into ``output_dir`` and the status
    file is ``training_status.json`` in the folder above it. Around Accelerate's save:

    - before it, the main process unlists every recorded checkpoint of the counter ``n`` or later,
      and the folder about to be written (a run saves over them; a folder half saved over must never
      be found listed); with automatic naming a folder of that name (a save a kill cut short, or one
      passed over at the resume) is removed, where Accelerate would raise. A run at counter 0 over
      recorded checkpoints is warned about (``TrainingStatusCheckpointWarning``): Accelerate's own
      ``load_state()`` does not advance the counter; ``load_state`` here does.
    - ``total_limit`` is set to None for the call (Accelerate removes the oldest folders before it
      writes the new one) and put back after;
    - after it, every process fsyncs every file it sees in the folder, the folder and the folders
      above it up to the status file's; once every process's save returned, the main process checks
      it sees every file each process sees, with the same size, and records the folder under
      ``accelerate/checkpoints`` (``steps``: ``n``; ``files``: each file with its size;
      ``world_size``: the number of processes); every process returns once that record is on disk;
    - ``total_limit`` (automatic naming): the oldest recorded folders beyond it are unlisted in the
      same write, and only then removed, never the newest; so are the ``checkpoint_<n>`` folders of
      a lower number that are not listed (a removal a kill interrupted), as Accelerate's own
      rotation would remove them. Without ``total_limit`` nothing is removed but a folder in the way.

    Several processes: every process must call it (the record is a collective of
    ``torch.distributed``, within the process group's timeout, ``InitProcessGroupKwargs(timeout=)``,
    else 1800 s: ``TrainingStatusCollectiveError`` names the processes that did not answer). Every
    process must see one folder at the same path (a shared filesystem): node-local folders make
    every process raise ``TrainingStatusCheckpointNotShared``.
    """
    _check(accelerator, "save_state")
    config = accelerator.project_configuration
    step = int(config.iteration)
    place, folder = saving(accelerator, output_dir)
    name = os.path.relpath(folder, place.root)
    timeout = _timeout(accelerator)
    automatic = bool(config.automatic_checkpoint_naming)
    _resuming.decide(lambda: _clear(place, name, step, automatic), lambda _: {}, place.root,
                       what=f"what to unlist before saving {name} of {place.root}", timeout=timeout)
    limit = config.total_limit
    config.total_limit = None  # Accelerate's rotation: before the save, of folders complete or not
    try:
        saved = accelerator.save_state(output_dir, **kwargs)
    finally:
        config.total_limit = limit
    if saved is not None and os.path.abspath(os.fspath(saved)) != folder:
        raise TrainingStatusCheckpointError(
            f"Accelerate saved into {os.fspath(saved)}, not {folder} where trainstatus expected it "
            "(a version of Accelerate that names its folders otherwise?). Nothing was recorded.",
            path=place.status, category=CATEGORY, file_path=os.fspath(saved),
        )
    keep = max(int(limit), 1) if automatic and limit is not None else None
    _saving.record(folder, place.status, lambda synced: _record(place, name, step, keep, synced),
                       what=f"{name} of {place.root}", timeout=timeout)
    return os.fspath(saved) if saved is not None else folder


def load_state(accelerator: Accelerator, input_dir: PathLike | None = None, **kwargs: Any) -> str | None:
    """Load the newest complete recorded checkpoint with ``accelerator.load_state(folder, **kwargs)``
    on every process, and set Accelerate's save counter after it; returns the folder, or None.

    ``input_dir``: the folder that holds the status file, which is ``project_dir`` with automatic
    checkpoint naming (the default there), else the folder that holds your checkpoint folders (the
    one above each ``output_dir`` given to ``save_state``). To load one folder of your choice, call
    ``accelerator.load_state(folder)`` itself.

    The folder is ``last_complete_checkpoint(input_dir)``'s choice, made once by the main process;
    every process checks it sees it with every recorded size (else every process raises
    ``TrainingStatusCheckpointNotShared``) and loads it. ``accelerator.project_configuration.iteration``
    is then the checkpoint's counter + 1, so the next ``save_state`` saves after it (Accelerate's own
    ``load_state`` leaves the counter where it was, and its next save runs into an existing folder).
    None, with nothing loaded, when nothing complete is recorded: a fresh start, said in a
    ``TrainingStatusCheckpointWarning`` when folders are there that were passed over, and why.
    """
    _check(accelerator, "load_state")
    config = accelerator.project_configuration
    if input_dir is None and not config.automatic_checkpoint_naming:
        raise TrainingStatusValueError(
            "load_state(accelerator) needs input_dir=, the folder that holds your checkpoint folders and the "
            f"status file {STATUS_FILE}, when automatic checkpoint naming is off (as accelerator.load_state() "
            "does); with ProjectConfiguration(automatic_checkpoint_naming=True) it is project_dir. Nothing was loaded."
        )
    place = project(accelerator, "load_state") if input_dir is None else _place(input_dir, "load_state")
    entry = _decide(place, _timeout(accelerator))
    if entry is None:
        return None
    accelerator.load_state(os.path.join(place.root, entry["file_path"]), **kwargs)
    config.iteration = int(entry["steps"]) + 1
    return os.path.join(place.shown, entry["file_path"])


def last_complete_checkpoint(directory: PathLike, *, timeout: float | None = None) -> str | None:
    """The newest recorded checkpoint folder of ``directory`` that is whole, or None.

    ``directory`` holds the status file: ``project_dir`` with automatic checkpoint naming
    (``<project_dir>/training_status.json``, beside ``checkpoints/``), else the folder that holds
    your checkpoint folders. Newest is the highest save counter. A folder counts when every file
    recorded in it is there with its recorded size, every process's ``random_states_<i>.pkl`` was
    recorded (for the number of processes that saved it), each ``.safetensors`` header accounts for
    its file's length, and each file ``torch.save`` wrote has its zip directory: metadata only, no
    weights are read. Newer recorded folders passed over are named, with the reason, in one
    ``TrainingStatusCheckpointWarning``; so, in another, are newer ``checkpoints/checkpoint_<n>``
    folders never recorded (a save a kill cut short), which Accelerate's own ``load_state()``
    would load. Nothing is changed or removed.

    Under a ``torch.distributed`` process group (an ``Accelerator`` made under ``accelerate
    launch`` or ``torchrun``) call it on every process: the main process reads and chooses, every
    process gets the same path (or the same error). ``timeout``: seconds to wait for every process
    (default 1800, torch's own).
    """
    place = _place(directory, "last_complete_checkpoint")
    return shown_path(place, _decide(place, timeout))


# -- the steps ----------------------------------------------------------------------------------


def _clear(place: Place, name: str, step: int, automatic: bool) -> None:
    """Before a save (the main process): unlist what it writes over, in one write, then remove a
    folder in its way (automatic naming)."""
    folder = os.path.join(place.root, name)
    os.makedirs(place.root, exist_ok=True)
    _lease.take(place.status, "trainstatus.integrations.accelerate.save_state")  # one job per status file
    store = StatusStore(place.status)
    try:
        checkpoints = CheckpointList(store, CATEGORY, keep=None, root=place.root)

        def over(entry: Any) -> bool:
            steps = entry.get("steps") if isinstance(entry, Mapping) else None
            path = entry.get("file_path") if isinstance(entry, Mapping) else None
            return ((type(steps) is int and steps >= step)
                    or (isinstance(path, str) and checkpoints.resolve(path) == folder))

        # A run at counter 0 over recorded checkpoints: which one could it have continued from?
        newest = None
        if step == 0 and any(over(e) for e in checkpoints.entries()):
            newest, _ = choose(checkpoints, whole(place.root))
        dropped, _ = drop(checkpoints, over)
    finally:
        store.close()
    if automatic and os.path.lexists(folder):
        # Unlisted now: a save a kill cut short, a folder passed over at the resume, or one of a
        # run this one started over. Accelerate raises on a folder that is there.
        if os.path.isdir(folder) and not os.path.islink(folder):
            shutil.rmtree(folder)
        else:
            os.remove(folder)
    if dropped and step == 0:
        _warn_started_over(place, name, dropped, newest)


def _record(place: Place, name: str, step: int, keep: int | None, synced: bool) -> dict[str, Any]:
    """The record (the main process, every process's files durable): add the folder, trim the list
    to ``keep`` in the same write, then remove what was trimmed and older folders no longer listed."""
    folder = os.path.join(place.root, name)
    if not os.path.isdir(folder):
        raise TrainingStatusCheckpointError(
            f"Cannot record {name} of {place.root}: Accelerate's save_state() returned, but {folder} is not there. "
            "Nothing was recorded.",
            path=place.status, category=CATEGORY, file_path=name,
        )
    store = StatusStore(place.status)
    try:
        # With the number of processes that wrote it (world_size), in the same write.
        entry = CheckpointList(store, CATEGORY, keep=keep, root=place.root)._add(
            step, name, synced=synced, fields=_saving.entry_fields())
        if keep is not None:
            sweep(place.root, store.to_dict(), CATEGORY, step)
    finally:
        store.close()
    return entry


def _decide(place: Place, timeout: float | None) -> dict[str, Any] | None:
    """The newest whole recorded entry, chosen by the main process, the same on every process."""
    return _resuming.decide(lambda: _choose(place), _resuming.entry_files, place.root,
                              what=f"the newest complete checkpoint of {place.shown}", timeout=timeout)


def _choose(place: Place) -> dict[str, Any] | None:
    """The newest whole recorded entry of ``place``, warning about the newer folders passed over."""
    entries: list[Any] = []
    entry: dict[str, Any] | None = None
    if os.path.exists(place.status) or _history.versions(place.root, STATUS_FILE):
        store = StatusStore(place.status, resume=True)
        try:
            checkpoints = CheckpointList(store, CATEGORY, keep=None, root=place.root)
            entries = checkpoints.entries()
            entry, skipped = choose(checkpoints, whole(place.root))
        finally:
            store.close()
        if skipped:
            warn_passed_over(shown_path(place, entry), skipped, place.status, CATEGORY, place.root, _WORDS)
        if entry is not None:  # a DeepSpeedPlugin's ZeRO folder loads only into as many processes as saved it
            me = _hosts.ranks()
            why = refusal(entry, os.path.join(place.shown, entry["file_path"]), 1 if me is None else me.world_size)
            if why is not None:
                raise TrainingStatusCheckpointError(
                    f"Cannot resume from {shown_path(place, entry)}: {why}. Nothing was loaded.",
                    path=place.status, category=CATEGORY, file_path=entry["file_path"],
                )
    else:
        refuse_misplaced(place)
    newer = unrecorded(place.root, entries, -1 if entry is None else int(entry["steps"]))
    if newer:
        warn(TrainingStatusCheckpointWarning(
            f"Passed over {', '.join(newer)} in {place.root}: not recorded in {place.status} (a save that did not "
            "finish, or one made without trainstatus.integrations.accelerate.save_state), so not known to be whole; "
            "Accelerate's own load_state() would load the newest of them. They are left on disk: this run's "
            "save_state() removes each before it saves into its name.",
            path=place.status, category=CATEGORY,
        ))
    return entry


# -- helpers ------------------------------------------------------------------------------------


def _check(accelerator: Any, call: str) -> None:
    if not isinstance(accelerator, Accelerator):
        raise TrainingStatusTypeError(
            f"{call}(accelerator, ...) needs the accelerate.Accelerator of the run, not "
            f"{type(accelerator).__name__!r} ({accelerator!r})."
        )
    me = _hosts.ranks()
    if me is not None and me.world_size != int(accelerator.num_processes):
        raise TrainingStatusError(
            f"{call}() on rank {me.rank}: Accelerate counts {accelerator.num_processes} process(es), but "
            f"torch.distributed has {me.world_size} ranks. Each would save as if it were alone (every rank writes "
            "random_states_0.pkl) and no checkpoint could be resumed with every process's state. Launch with "
            "accelerate launch (with --multi_gpu, or --cpu on a machine without GPU), or under torchrun make "
            "Accelerator(cpu=True) on CPU; with a DeepSpeedPlugin under torchrun set ACCELERATE_USE_DEEPSPEED=true. "
            "Nothing was saved or loaded."
        )
    if int(accelerator.num_processes) > 1 and me is None:
        raise TrainingStatusError(
            f"{call}() runs in one of {accelerator.num_processes} processes, but no torch.distributed process "
            "group of them is initialized here (Accelerate on TPU or another backend): trainstatus cannot wait for "
            "every process's files nor share one decision. Nothing was saved or loaded."
        )


def _timeout(accelerator: Accelerator) -> float | None:
    """The process group's timeout (``InitProcessGroupKwargs(timeout=)``), else None (torch's 1800 s)."""
    seconds = getattr(getattr(accelerator, "init_handler", None), "timeout", None)
    return None if seconds is None else float(seconds.total_seconds())


def _warn_started_over(place: Place, name: str, dropped: list[Any], newest: Mapping[str, Any] | None) -> None:
    up_to = max((e["steps"] for e in dropped if type(e.get("steps")) is int), default=0)
    start = (f"save_state() saves {name} with Accelerate's save counter at 0 "
             f"(accelerator.project_configuration.iteration) in {place.root}, where {place.status} recorded "
             f"checkpoints up to counter {up_to}: they are no longer listed, and this run saves over their folders "
             "as its counter reaches them.")
    if newest is None:
        advice = (f" None of them was whole. To keep them, stop and move them out of {place.root}, or give "
                  "Accelerate another project_dir.")
    else:
        path = os.path.join(place.root, newest["file_path"])
        advice = (f" If you meant to continue, stop and load the newest whole one, {path}, with "
                  f"accelerator.load_state({path!r}) and set accelerator.project_configuration.iteration = "
                  f"{int(newest['steps']) + 1} (Accelerate's load_state() leaves the counter where it was; "
                  "load_state(accelerator) of trainstatus.integrations.accelerate sets it), before this run "
                  "saves over it; to start over without this warning, give Accelerate another project_dir.")
    warn(TrainingStatusCheckpointWarning(start + advice, path=place.status, category=CATEGORY))
