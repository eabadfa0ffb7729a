"""DeepSpeed: a tag saved by ``engine.save_checkpoint`` recorded once every rank's shards are
durable, and one resume decision for every rank, for training loops that call the engine themselves.

DeepSpeed's own resume reads ``save_dir/latest``, which rank 0 writes while the other ranks may
still be writing their shards, with no fsync: a kill leaves it empty (every later
``load_checkpoint`` fails on a bare ``AssertionError``) or naming a tag whose rank-1 shard is half
written. Here:

- ``save_checkpoint(engine, save_dir)``: every rank calls it instead of ``engine.save_checkpoint``.
  The tag folder is unlisted first if it is listed (a tag saved over in place), DeepSpeed saves,
  then the ranks wait for each other, one rank per host fsyncs what its host sees of the folder,
  and rank 0 records it (every file with its size, and the number of ranks) in the status file
  ``save_dir/training_status.json``, under ``deepspeed/checkpoints``. ``latest`` is then written
  naming the tag, atomically, for DeepSpeed's own tools.
- ``load_checkpoint(engine, load_dir)``: rank 0 picks the newest recorded tag whose files are all
  there with their recorded sizes, with every rank's ZeRO shards and each file's zip directory (no
  tensor is read); every rank loads that tag (``engine.load_checkpoint(load_dir, tag=...)``).
  ``latest`` is never read.
- ``last_complete_checkpoint(save_dir)``: that tag's name, or None.

Usage (every rank)::

    from trainstatus.integrations.deepspeed import load_checkpoint, save_checkpoint

    engine, *_ = deepspeed.initialize(model=model, config=config, model_parameters=model.parameters())
    load_path, client_state = load_checkpoint(engine, "ckpt")     # (None, None): nothing recorded
    for batch in batches:
        ...
        save_checkpoint(engine, "ckpt", keep=3)                      # every rank

Without an initialized process group (one process) all three work the same, without the
collectives. Nothing of DeepSpeed or torch is imported here: the engine is the caller's.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Mapping
from typing import Any

from .._checkpoints.checkpoint_list import CheckpointList
from .._checkpoints.files import FILES
from .._errors import (
    TrainingStatusCheckpointError,
    TrainingStatusCheckpointWarning,
    TrainingStatusTypeError,
    TrainingStatusValueError,
    TrainingStatusWriteError,
    warn,
)
from .._store import StatusStore
from ._deepspeed import latest, rotation
from ._deepspeed.places import (
    CATEGORY,
    STATUS_FILE,
    check_tag,
    refuse_status_inside,
    refuse_tag_folder,
    save_root,
    unrecorded,
    warn_unrecorded,
)
from ._formats.deepspeed_tags import MODEL_STATES, decoupled, is_tag, reshard_problem, shape, way_out, whole
from ._formats.deepspeed_tags import ranks as _ranks
from ._ranks.hosts import ranks
from ._ranks.resuming import decide, entry_files
from ._ranks.saving import entry_fields
from ._ranks.saving import record as _record
from ._shared import lease as _lease
from ._shared.choice import choose_unlisting, later, left_listed, reasons, recorded
from ._shared.upkeep import drop

__all__ = ["CATEGORY", "STATUS_FILE", "last_complete_checkpoint", "load_checkpoint", "save_checkpoint"]

PathLike = str | os.PathLike[str]


def save_checkpoint(engine: Any, save_dir: PathLike, tag: Any = None, client_state: Mapping[str, Any] | None = None,
                    *, status_path: PathLike | None = None, keep: int | None = None, reward: float | None = None,
                    timeout: float | None = None, save_latest: bool = True,
                    exclude_frozen_parameters: bool = False) -> dict[str, Any]:
    """``engine.save_checkpoint(save_dir, tag, client_state)``, recorded once every rank's files
    are durable. Every rank calls it, with the same arguments (as DeepSpeed requires).

    - ``tag``: the tag folder's name inside ``save_dir``; DeepSpeed's default,
      ``global_step<engine.global_steps>``, when None. The entry's step is ``engine.global_steps``.
    - A tag that is listed (saved over in place: a fixed ``tag="last"``, or a step saved again after
      a resume went back) is unlisted first, in one durable write by rank 0, before any rank saves:
      a kill while DeepSpeed writes over it never leaves it listed with two steps' shards.
    - Once every rank's ``engine.save_checkpoint`` returned, one rank per host fsyncs the files its
      host sees in the tag folder; rank 0 records the tag (every file with its size, and
      ``world_size``) under ``deepspeed/checkpoints`` of the status file, which is
      ``save_dir/training_status.json`` unless ``status_path`` names another (never inside a tag
      folder). Entries of steps after this one are dropped from the list (a run that went back
      saves over them; their files stay on disk).
    - ``save_latest``: rank 0 then makes ``save_dir/latest`` name this tag, atomically and durably,
      for DeepSpeed's own tools (``zero_to_fp32.py``, a bare ``engine.load_checkpoint(dir)``);
      DeepSpeed's own write of it is turned off, and ``latest`` is removed before a tag it names is
      saved over.
    - ``keep=N``: after the record is on disk, the oldest entries beyond N are dropped from the list
      in one write and only then their tag folders removed; a folder never recorded is never
      removed. The tags about to be dropped are written down first (``deepspeed/removing``), so
      that one a kill stopped the rotation from removing is removed at the next save.
    - ``reward``: a score kept with the entry; ``timeout``: seconds every collective waits for every
      rank (default 1800, torch's own), after which the late rank is named in a
      ``TrainingStatusCollectiveError``.

    Returns the entry recorded, the same on every rank. An engine whose checkpoint engine is
    decoupled (it writes after ``save_checkpoint`` returns) is refused: its files are not there to
    record.
    """
    root = save_root(save_dir, "save into")
    name = check_tag(f"global_step{_steps(engine)}" if tag is None else tag, root)
    step = _steps(engine)
    folder = os.path.join(root, name)
    path = _status_path(root, status_path)
    refuse_status_inside(path, folder, f"save into {folder}", look=False)
    _check_keep(keep, reward, folder)
    _refuse_decoupled(engine, folder)

    def unlist() -> None:
        # Rank 0's (its error reaches every rank): what it sees of the filesystem may not be
        # what another rank sees, and a rank raising alone leaves the others in the collective.
        refuse_status_inside(path, folder, f"save into {folder}")
        _lease.take(path, "trainstatus.integrations.deepspeed.save_checkpoint")  # one job per status file
        if save_latest:
            latest.forget(root, name)
        if not recorded(path):
            return  # nothing is listed: nothing to drop
        store = StatusStore(path)
        try:
            checkpoints = CheckpointList(store, CATEGORY, keep=None, root=root)
            drop(checkpoints, lambda entry: _names(checkpoints, entry, folder))
        finally:
            store.close()

    decide(unlist, lambda _: {}, root, what=f"the entry of {folder} to drop before it is saved over", timeout=timeout)
    engine.save_checkpoint(root, tag=name, client_state={} if client_state is None else dict(client_state),
                           save_latest=False, exclude_frozen_parameters=exclude_frozen_parameters)

    def write(synced: bool) -> dict[str, Any]:
        if not is_tag(folder):
            raise TrainingStatusCheckpointError(
                f"Cannot record {folder}: it holds no *{MODEL_STATES}, which DeepSpeed's save_checkpoint writes. "
                "Was it given another save_dir or tag on some rank? Nothing was recorded.",
                path=path, category=CATEGORY, file_path=name,
            )
        store = StatusStore(path)
        try:
            checkpoints = CheckpointList(store, CATEGORY, keep=keep, root=root)
            drop(checkpoints, lambda entry: later(entry, step) or _names(checkpoints, entry, folder))
            if keep is not None:
                rotation.before_add(store, checkpoints, keep, name)
            entry = checkpoints._add(step, name, reward=reward, synced=synced, fields=entry_fields())
        finally:
            store.close()
        if save_latest:
            latest.name(root, name)
        return entry

    return _record(folder, path, write, what=f"{folder} (step {step})", timeout=timeout)


def load_checkpoint(engine: Any, load_dir: PathLike, *, status_path: PathLike | None = None,
                    timeout: float | None = None, **load_options: Any) -> tuple[Any, Any]:
    """``engine.load_checkpoint(load_dir, tag=<the newest complete tag>, **load_options)``, the same
    tag on every rank; ``(None, None)`` when nothing is recorded (a fresh run: a warning names any
    tag folder lying there unrecorded). Every rank calls it.

    The tag is ``last_complete_checkpoint``'s (``latest`` is never read). Before DeepSpeed loads
    anything, a ZeRO tag saved by another number of ranks than this run's is refused on every rank
    with a ``TrainingStatusCheckpointError`` that names both numbers and the way out (the same
    number of ranks, or DeepSpeed's universal checkpoint): DeepSpeed itself raises
    ``ZeRORuntimeException`` partway through the load. ``load_options`` are DeepSpeed's
    (``load_module_strict``, ``load_optimizer_states``, ``load_lr_scheduler_states``,
    ``load_module_only``, ``custom_load_fn``); ``tag`` is trainstatus's to choose.
    """
    if "tag" in load_options:
        raise TrainingStatusTypeError(
            "load_checkpoint(engine, load_dir, tag=...): trainstatus chooses the tag (the newest one recorded whole). "
            "To load a tag of your choice, call engine.load_checkpoint(load_dir, tag=...) yourself."
        )
    universal = getattr(engine, "load_universal_checkpoint", None)
    if callable(universal) and universal():
        raise TrainingStatusTypeError(
            "load_checkpoint(engine, ...): this engine's config loads a universal checkpoint (\"checkpoint\": "
            "{\"load_universal\": true}), a converted copy that trainstatus does not record. Load it with "
            "engine.load_checkpoint(load_dir, tag=\"<tag>_universal\") yourself, or remove load_universal to "
            "resume from the tags trainstatus recorded. Nothing was loaded."
        )
    optimizer = bool(load_options.get("load_optimizer_states", True)) and not load_options.get("load_module_only")
    tag = _newest(load_dir, status_path, timeout, "load_checkpoint", optimizer)
    if tag is None:
        return None, None
    return engine.load_checkpoint(os.fspath(load_dir), tag=tag, **load_options)  # type: ignore[no-any-return]


def last_complete_checkpoint(save_dir: PathLike, *, status_path: PathLike | None = None,
                             timeout: float | None = None) -> str | None:
    """The newest recorded tag of ``save_dir`` that is whole, or None: for
    ``engine.load_checkpoint(save_dir, tag=...)``.

    A tag counts when every file recorded in it is there with its recorded size, its module states
    are there, every data-parallel rank from 0 up to the highest recorded has its ZeRO shards, and
    each ``.pt`` file's zip directory is whole (no tensor is read). Newer recorded tags passed over
    are named, with the reason, in one ``TrainingStatusCheckpointWarning``, and dropped from the
    list (this run saves over them as it reaches their steps; their files stay on disk). A tag saved
    by another number of ranks is returned with a warning (``load_checkpoint`` refuses it where
    DeepSpeed cannot load it). Under a process group every rank calls it and gets the same tag;
    None when nothing is recorded, with a warning naming any unrecorded tag folder.
    """
    return _newest(save_dir, status_path, timeout, "last_complete_checkpoint", None)


def _newest(given: PathLike, status_path: PathLike | None, timeout: float | None, call: str,
            optimizer: bool | None) -> str | None:
    """The tag every rank resumes from; ``optimizer`` None: a world-size change is said, not refused."""
    root = save_root(given, "read")
    shown = os.fspath(given)
    path = _status_path(root, status_path)
    now = ranks()
    world = 1 if now is None else now.world_size

    def pick() -> dict[str, Any] | None:
        # Rank 0's checks (their error reaches every rank): another rank may see another filesystem.
        refuse_tag_folder(root, shown, path, call)
        refuse_status_inside(path, None, f"read {path}")
        if not recorded(path):
            warn_unrecorded(unrecorded(root, set()), root, path)
            return None
        store = StatusStore(path, resume=True)
        try:
            checkpoints = CheckpointList(store, CATEGORY, keep=None, root=root)
            entry, skipped, refused = choose_unlisting(checkpoints, whole(root))
            if skipped:
                _warn_passed_over(entry, skipped, path, root, refused)
            if entry is None:
                listed = {e["file_path"] for e in checkpoints.entries()
                          if isinstance(e, Mapping) and isinstance(e.get("file_path"), str)}
                warn_unrecorded(unrecorded(root, listed), root, path)
            else:
                _compare_world_size(entry, root, path, world, optimizer)
            return entry
        finally:
            store.close()

    entry = decide(pick, entry_files, root, what=f"the newest complete tag of {root}", timeout=timeout)
    return None if entry is None else str(entry["file_path"])


def _compare_world_size(entry: Mapping[str, Any], root: str, path: str, world: int, optimizer: bool | None) -> None:
    """Refuse (``optimizer`` not None: a load follows) or say that the tag chosen was saved by
    another number of ranks than this run's ``world``."""
    saved = entry.get("world_size", 1)
    if type(saved) is not int or saved == world:
        return
    tag = entry["file_path"]
    files = entry[FILES] if isinstance(entry.get(FILES), Mapping) else {}
    found = shape(name[len(tag) + 1:] for name in files if name.startswith(tag + os.sep))
    folder = os.path.join(root, tag)
    problem = reshard_problem(found, saved, world, optimizer=optimizer is not False)
    if problem is not None and optimizer is not None:
        raise TrainingStatusCheckpointError(
            f"Cannot resume from {folder}: it was saved by {_ranks(saved)} and this run has {world}, and {problem}: "
            f"DeepSpeed cannot load it (it raises ZeRORuntimeException partway through). {way_out(folder, saved)}. "
            "Nothing was loaded.",
            path=path, category=CATEGORY, file_path=tag,
        )
    warn(TrainingStatusCheckpointWarning(
        f"{folder} was saved by {_ranks(saved)} and this run has {world}"
        + (f": {problem}, so engine.load_checkpoint cannot load it as it is (trainstatus's load_checkpoint refuses "
           f"it). {way_out(folder, saved)}." if problem is not None else
           ": its module states load into any number of ranks, but a state a loop keeps per rank (in "
           "client_state) comes back only for the ranks that saved it."),
        path=path, category=CATEGORY,
    ))


def _warn_passed_over(entry: Mapping[str, Any] | None, skipped: list[tuple[Any, str]], path: str, root: str,
                      refused: TrainingStatusWriteError | None) -> None:
    """Say which newer recorded tags a resume passed over, and that they are no longer listed (or,
    ``refused``, that the status file could not be written to unlist them)."""
    if entry is not None:
        start = f"{entry['file_path']} is the newest whole tag recorded in {path}; the newer ones cannot be resumed from"
        fresh = ""
    else:
        start = f"No tag recorded in {path} can be resumed from"
        fresh = " The resume starts from scratch."
    left = left_listed(path, refused) if refused is not None else (
        f"They are no longer listed (this run saves over them as it reaches "
        f"their steps, and a tag half saved over must not be found listed); their files are left in {root}. To keep "
        f"them, stop and move them out of {root}, or save into another folder.")
    warn(TrainingStatusCheckpointWarning(f"{start}: {reasons(skipped)}.{fresh} {left}",
                                         skipped=list(skipped), path=path, category=CATEGORY))


def _check_keep(keep: Any, reward: Any, folder: str) -> None:
    """``keep`` and ``reward`` checked before anything is unlisted or saved (``CheckpointList``
    would refuse them only at the record, after DeepSpeed wrote the tag)."""
    if keep is not None and (type(keep) is not int or keep < 1):
        raise (TrainingStatusValueError if type(keep) is int else TrainingStatusTypeError)(
            f"save_checkpoint(..., keep={keep!r}) into {folder}: keep is a number of tags >= 1, or None to keep every "
            "one. Nothing was saved."
        )
    if reward is not None and (type(reward) is bool or not isinstance(reward, numbers.Real)):
        raise TrainingStatusTypeError(
            f"save_checkpoint(..., reward={reward!r}) into {folder}: reward is a number (a validation score), or "
            "None. Nothing was saved."
        )


def _refuse_decoupled(engine: Any, folder: str) -> None:
    kind = decoupled(engine)
    if kind is not None:
        raise TrainingStatusTypeError(
            f"save_checkpoint(engine, ...) into {folder}: this engine's checkpoint engine "
            f"({kind}) is decoupled: it writes the files after save_checkpoint returns, "
            "so there is nothing whole to record then. Use DeepSpeed's default torch checkpoint engine with "
            "trainstatus. Nothing was saved."
        )


def _steps(engine: Any) -> int:
    steps = getattr(engine, "global_steps", None)
    if type(steps) is bool or not isinstance(steps, numbers.Integral) or steps < 0:
        raise TrainingStatusTypeError(
            f"save_checkpoint(engine, ...): engine.global_steps is {steps!r}, not a step count: pass the "
            "DeepSpeedEngine deepspeed.initialize returned."
        )
    return int(steps)


def _names(checkpoints: CheckpointList, entry: Any, folder: str) -> bool:
    """Does ``entry`` name ``folder`` (resolved as the list resolves it)?"""
    if not isinstance(entry, Mapping) or not isinstance(entry.get("file_path"), str):
        return False
    return os.path.realpath(checkpoints.resolve(entry["file_path"])) == os.path.realpath(folder)



def _status_path(root: str, status_path: PathLike | None) -> str:
    return os.path.join(root, STATUS_FILE) if status_path is None else os.path.abspath(os.fspath(status_path))

