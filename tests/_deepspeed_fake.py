"""A stand-in for the ``DeepSpeedEngine`` that trainstatus.integrations.deepspeed drives, for the
default run's tests (tests/test_deepspeed_protocol.py): it writes what deepspeed 0.19.8's
``save_checkpoint`` writes, by name and format, without torch.

Each file is a small zip archive with the ``data.pkl`` and ``version`` members ``torch.save``
writes (what ``_formats.torch_zip`` checks). Under ZeRO (``stage`` 1 or 2) rank 0 writes
``mp_rank_00_model_states.pt`` and every rank its ``zero_pp_rank_<r>_mp_rank_00_optim_states.pt``;
under ZeRO-3 every rank writes a model and an optimizer file of its own; at stage 0 rank 0 writes
the model states alone. ``latest`` is written as DeepSpeed does (rank 0, ``open(..., "w")``) when
``save_latest`` is true. The real engine runs in tests/test_integration_deepspeed.py.
"""

from __future__ import annotations

import io
import os
import zipfile
from collections.abc import Callable
from pathlib import Path
from typing import Any


def torch_saved(payload: bytes) -> bytes:
    """The bytes of a file shaped as ``torch.save`` writes it: a zip archive of ``<name>/data.pkl``,
    ``<name>/version`` and one storage member holding ``payload``."""
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w", zipfile.ZIP_STORED) as archive:
        archive.writestr("archive/data.pkl", b"\x80\x02}q\x00.")
        archive.writestr("archive/version", b"3\n")
        archive.writestr("archive/data/0", payload)
    return buffer.getvalue()


def file_names(stage: int, rank: int) -> list[str]:
    """The files ``rank`` writes into a tag folder at ZeRO ``stage``."""
    names = []
    if stage == 3:
        names.append(f"zero_pp_rank_{rank}_mp_rank_00_model_states.pt")
    elif rank == 0:
        names.append("mp_rank_00_model_states.pt")
    if stage >= 1:
        names.append(f"zero_pp_rank_{rank}_mp_rank_00_optim_states.pt")
    return names


class _CheckpointEngine:
    def __init__(self, decoupled: bool) -> None:
        self.decoupled = decoupled

    def is_decoupled(self) -> bool:
        return self.decoupled


class FakeEngine:
    """What trainstatus uses of a ``DeepSpeedEngine``: ``global_steps``, ``save_checkpoint``,
    ``load_checkpoint``, ``load_universal_checkpoint``, ``checkpoint_engine.is_decoupled``.

    ``write(path, data)`` writes a file (a ``World``'s ``write`` for the rank, under the fake
    group); ``before_save`` runs as ``save_checkpoint`` begins (a test looks at the status file
    then, or raises to stand for a kill in the middle); ``saves`` and ``loads`` are the calls made.
    """

    def __init__(self, rank: int = 0, stage: int = 2, *, steps: int = 0, universal: bool = False,
                 decoupled: bool = False, write: Callable[[Path, bytes], None] | None = None) -> None:
        self.rank, self.stage, self.global_steps, self.universal = rank, stage, steps, universal
        self.checkpoint_engine = _CheckpointEngine(decoupled)
        self.write = write or (lambda path, data: path.write_bytes(data))
        self.before_save: Callable[[], None] | None = None
        self.saves: list[dict[str, Any]] = []
        self.loads: list[tuple[str, Any, dict[str, Any]]] = []

    def save_checkpoint(self, save_dir: str, tag: Any = None, client_state: Any = None, save_latest: bool = True,
                        exclude_frozen_parameters: bool = False) -> bool:
        self.saves.append({"save_dir": save_dir, "tag": tag, "client_state": client_state,
                           "save_latest": save_latest, "exclude_frozen_parameters": exclude_frozen_parameters})
        if self.before_save is not None:
            self.before_save()
        tag = f"global_step{self.global_steps}" if tag is None else str(tag)
        folder = Path(save_dir) / tag
        folder.mkdir(parents=True, exist_ok=True)
        for name in file_names(self.stage, self.rank):
            self.write(folder / name, torch_saved(f"{name} at step {self.global_steps}".encode() * 50))
        if save_latest and self.rank == 0:
            with open(os.path.join(save_dir, "latest"), "w") as f:
                f.write(tag)
        return True

    def load_checkpoint(self, load_dir: str, tag: Any = None, **options: Any) -> tuple[str, dict[str, Any]]:
        self.loads.append((load_dir, tag, options))
        return os.path.join(load_dir, str(tag)), {"tag": tag}

    def load_universal_checkpoint(self) -> bool:
        return self.universal
