"""Pieces the training children share (tests/_transformers_ranks.py, _accelerate_trainer.py,
_deepspeed_trainer.py): a small regression model for the Transformers Trainer with its data, and
the step counter a loop registers for Accelerate to checkpoint. torch is imported when a piece is
asked for: the children run in environments that have it, the suite's own does not."""

from __future__ import annotations

from typing import Any


def trainer_parts(width: int) -> tuple[Any, Any]:
    """``(Tiny, Data)``: a model of two hidden layers ``width`` wide whose forward returns the
    Trainer's ``{"loss": ...}``, and a dataset of ``n`` seeded examples (``{"x", "labels"}``, the labels times ``sign``:
    -1 makes an evaluation set the model gets worse on as it trains)."""
    import torch

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.net = torch.nn.Sequential(torch.nn.Linear(8, width), torch.nn.ReLU(), torch.nn.Linear(width, width),
                                           torch.nn.ReLU(), torch.nn.Linear(width, 1))

        def forward(self, x: Any, labels: Any = None) -> dict[str, Any]:
            return {"loss": torch.nn.functional.mse_loss(self.net(x), labels)}

    class Data(torch.utils.data.Dataset):  # type: ignore[type-arg]
        def __init__(self, n: int, sign: float = 1.0) -> None:
            generator = torch.Generator().manual_seed(n)
            self.x, self.y = torch.randn(n, 8, generator=generator), sign * torch.randn(n, 1, generator=generator)

        def __len__(self) -> int:
            return len(self.x)

        def __getitem__(self, i: int) -> dict[str, Any]:
            return {"x": self.x[i], "labels": self.y[i]}

    return Tiny, Data


class Progress:
    """The loop's step, registered with ``accelerator.register_for_checkpointing``."""

    step = 0

    def state_dict(self) -> dict[str, int]:
        return {"step": self.step}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.step = state["step"]
