"""What a DeepSpeed checkpoint tag folder holds, and whether a recorded one is whole, from file
names and ``torch.save``'s zip directories alone.

``DeepSpeedEngine.save_checkpoint(save_dir, tag)`` (deepspeed 0.19.8, ``runtime/engine.py``)
writes ``save_dir/<tag>/``: ``mp_rank_<m>_model_states.pt`` (the module, by data-parallel rank 0 of
each model-parallel rank), and under ZeRO one ``[bf16_]zero_pp_rank_<r>_mp_rank_<m>_optim_states.pt``
per data-parallel rank ``r``; under ZeRO-3 the module is partitioned too, and each rank writes a
``zero_pp_rank_<r>_mp_rank_<m>_model_states.pt`` instead. A ZeRO checkpoint loads only into as many
data-parallel ranks as wrote it (``ZeRORuntimeException`` otherwise), unless it was converted to a
universal checkpoint (``ds_to_universal``, which writes ``latest_universal`` beside the tags).
"""

from __future__ import annotations

import dataclasses
import os
import re
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from ..._checkpoints.files import FILES
from . import torch_zip

__all__ = ["Shape", "decoupled", "is_tag", "ranks", "refusal", "reshard_problem", "shape", "shards_problem", "tags_in",
           "way_out", "whole"]

MODEL_STATES = "_model_states.pt"
_RANK_FILE = re.compile(r"(?:bf16_)?zero_pp_rank_(\d+)_mp_rank_(\d+)_(optim|model)_states\.pt")
_MODULE_FILE = re.compile(r"mp_rank_(\d+)_model_states\.pt")


@dataclasses.dataclass(frozen=True)
class Shape:
    """What a tag folder's file names say: its ZeRO files as (kind, data-parallel rank,
    model-parallel rank), kind ``optim`` or ``model`` (ZeRO-3 partitions the weights too), and the
    model-parallel ranks whose ``mp_rank_<m>_model_states.pt`` is there."""

    zero_files: frozenset[tuple[str, int, int]]
    modules: frozenset[int]

    @property
    def zero(self) -> bool:
        return bool(self.zero_files)

    @property
    def stage3(self) -> bool:
        return any(kind == "model" for kind, _, _ in self.zero_files)

    @property
    def has_module_states(self) -> bool:
        return bool(self.modules) or self.stage3


def shape(names: Iterable[str]) -> Shape:
    """The ``Shape`` of a tag folder whose files (base names) are ``names``."""
    zero: set[tuple[str, int, int]] = set()
    modules: set[int] = set()
    for name in names:
        found = _RANK_FILE.fullmatch(name)
        if found:
            zero.add((found.group(3), int(found.group(1)), int(found.group(2))))
            continue
        found = _MODULE_FILE.fullmatch(name)
        if found:
            modules.add(int(found.group(1)))
    return Shape(frozenset(zero), frozenset(modules))


def is_tag(folder: str) -> bool:
    """Does ``folder`` hold a file DeepSpeed's ``save_checkpoint`` names ``*_model_states.pt``?"""
    try:
        return any(name.endswith(MODEL_STATES) for name in os.listdir(folder))
    except OSError:
        return False


def shards_problem(tag: str, names: Iterable[str]) -> str | None:
    """Why the tag folder ``tag`` whose recorded files (base names) are ``names`` lacks files a
    load needs, or None: module states are there; for each model-parallel rank, every
    data-parallel rank from 0 up to the highest present has its ZeRO optimizer shard, under ZeRO-3
    its weights' shard too, and below ZeRO-3 the module's ``mp_rank_<m>_model_states.pt`` is there.
    The number of ranks is not compared with the world size that saved it: MiCS and ZeRO++'s hpZ
    save the optimizer shards of one shard group only."""
    found = shape(names)
    if not found.has_module_states:
        return f"{tag} has no *{MODEL_STATES} recorded: not a finished DeepSpeed save_checkpoint"
    for mp in sorted({m for _, _, m in found.zero_files}):
        optim = {dp for kind, dp, m in found.zero_files if kind == "optim" and m == mp}
        model = {dp for kind, dp, m in found.zero_files if kind == "model" and m == mp}
        ranks = set(range(max(optim | model) + 1))
        for kind, present in (("optim", optim), ("model", model)) if found.stage3 else (("optim", optim),):
            missing = sorted(ranks - present)
            if missing:
                return (f"{tag} has no ZeRO {'optimizer' if kind == 'optim' else 'weights'} shard of rank"
                        f"{'s' if len(missing) > 1 else ''} {', '.join(map(str, missing))} recorded "
                        f"(zero_pp_rank_<rank>_mp_rank_{mp:02d}_{kind}_states.pt)")
        if not found.stage3 and mp not in found.modules:
            return f"{tag} has no mp_rank_{mp:02d}{MODEL_STATES} recorded (the module's states)"
    return None


def tags_in(folder: str, files: Iterable[str]) -> dict[str, list[str]]:
    """The tag folders directly inside the recorded checkpoint folder ``folder`` (a Trainer's
    ``checkpoint-<N>/global_step<N>/``, Accelerate's ``checkpoint_<n>/pytorch_model/``), each with
    the base names of its recorded files, from ``files`` (paths relative to the list's root)."""
    inside: dict[str, list[str]] = {}
    for name in files:
        parts = name[len(folder) + 1:].split(os.sep) if name.startswith(folder + os.sep) else []
        if len(parts) == 2:
            inside.setdefault(parts[0], []).append(parts[1])
    return {tag: names for tag, names in inside.items() if any(n.endswith(MODEL_STATES) for n in names)}


def whole(root: str) -> Callable[[dict[str, Any]], bool]:
    """The check of a recorded tag folder (paths under ``root``) beyond its files' sizes:
    ``shards_problem``, and each ``.pt`` file's zip directory. Raises a ValueError naming what is
    wrong; no tensor is read."""

    def check(entry: dict[str, Any]) -> bool:
        tag = entry["file_path"]
        files: Mapping[str, Any] = entry[FILES] if isinstance(entry.get(FILES), Mapping) else {}
        why = shards_problem(tag, [name[len(tag) + 1:] for name in files if name.startswith(tag + os.sep)])
        if why is not None:
            raise ValueError(why)
        for name in sorted(files):
            if name.endswith(".pt"):
                why = torch_zip.problem(os.path.join(root, name))
                if why is not None:
                    raise ValueError(f"{name}: {why}")
        return True

    return check


def reshard_problem(found: Shape, saved: int, now: int, *, optimizer: bool = True) -> str | None:
    """Why a tag folder of shape ``found``, saved by ``saved`` ranks, cannot be loaded by ``now``
    ranks (what DeepSpeed's ``load_checkpoint`` raises ``ZeRORuntimeException`` or fails on), or
    None. ``optimizer``: the optimizer's state is to be loaded (DeepSpeed's
    ``load_optimizer_states=True`` and not ``load_module_only``)."""
    if saved == now or not found.zero:
        return None
    if found.stage3:
        return "ZeRO-3 partitions the model's weights themselves across the ranks that saved them"
    if optimizer:
        return "ZeRO partitions the optimizer's state across the ranks that saved it"
    return None


def way_out(folder: str, saved: int) -> str:
    """What to do about a ``reshard_problem``: the same number of ranks, or a universal checkpoint."""
    return (f"Resume with {ranks(saved)}, or convert {folder} into DeepSpeed's universal checkpoint, which loads "
            f"into any number of ranks (python -m deepspeed.checkpoint.ds_to_universal --input_folder {folder} "
            f"--output_folder {folder}_universal, then \"checkpoint\": {{\"load_universal\": true}} in the "
            "DeepSpeed config)")


def decoupled(engine: Any) -> str | None:
    """The class name of ``engine``'s checkpoint engine when it is decoupled (it writes the files
    after ``save_checkpoint`` returns, in another process: nothing is whole to record then), or None."""
    checkpoint_engine = getattr(engine, "checkpoint_engine", None)
    is_decoupled = getattr(checkpoint_engine, "is_decoupled", None)
    return type(checkpoint_engine).__name__ if callable(is_decoupled) and is_decoupled() else None


def refusal(entry: Mapping[str, Any], shown: str, world: int, *, optimizer: bool = True) -> str | None:
    """Why the recorded checkpoint folder ``entry`` (shown as ``shown``), holding DeepSpeed tag
    folders, cannot be resumed by ``world`` ranks, worded for an error, or None: a ZeRO tag saved by
    another number of ranks, unless the folder holds ``latest_universal`` (``ds_to_universal``
    writes it beside the converted tag). An entry without ``world_size`` was saved by one process.
    ``optimizer``: the optimizer's state is to be loaded (``reshard_problem``)."""
    saved = entry.get("world_size", 1)
    folder = entry["file_path"]
    files: Mapping[str, Any] = entry[FILES] if isinstance(entry.get(FILES), Mapping) else {}
    if type(saved) is not int or saved == world or os.path.isfile(os.path.join(shown, "latest_universal")):
        return None
    for tag, names in sorted(tags_in(folder, files).items()):
        why = reshard_problem(shape(names), saved, world, optimizer=optimizer)
        if why is not None:
            return (f"it was saved by {ranks(saved)} with DeepSpeed and this run has {world}, and {why}: DeepSpeed "
                    f"cannot load its {tag} (it raises ZeRORuntimeException partway through). "
                    f"{way_out(os.path.join(shown, tag), saved)}, then resume from {shown} again")
    return None


def ranks(count: int) -> str:
    """``count`` ranks, in words: "1 rank", "2 ranks"."""
    return f"{count} rank{'' if count == 1 else 's'}"
