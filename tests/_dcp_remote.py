"""A DCP training loop whose checkpoint folders are on S3 (``checkpoint_id="s3://..."``), for
tests/test_integration_dcp.py: run under ``torchrun --nproc_per_node=2`` (or alone).

``python _dcp_remote.py URL MODE STEPS [DIE_AT]``: resumes from ``last_complete_checkpoint(URL)``,
then saves STEPS more steps with ``trainstatus.integrations.dcp.save``: MODE ``steps`` into
``URL/step-<n>`` (``keep=2``), ``inplace`` into ``URL/latest``. With DIE_AT, rank 1 is killed at that
step once DCP planned the save, before its shard is uploaded. Each rank's tensor (under a key of its own) is ``rank + step``,
so what a rank loaded says which step's shard it read. One JSON line an event, one write each.
"""

from __future__ import annotations

import json
import os
import sys
import warnings
from typing import Any


def say(**record: Any) -> None:
    os.write(1, (json.dumps(record) + "\n").encode())


def main() -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint._fsspec_filesystem import FsspecWriter

    from trainstatus.integrations import dcp as tdcp

    url, mode, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
    die_at = int(sys.argv[4]) if len(sys.argv) > 4 else None
    if "RANK" in os.environ:
        dist.init_process_group("gloo")
    rank = dist.get_rank() if dist.is_initialized() else 0
    mine = f"w{rank}"  # a key of each rank's own: DCP saves a tensor under one key once, rank 0's copy
    state = {mine: torch.zeros(4), "step": torch.tensor(0)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            resume = tdcp.last_complete_checkpoint(url)
        except Exception as exc:  # a refusal: said, and the run stops
            say(event="refused", rank=rank, type=type(exc).__name__, message=str(exc))
            raise SystemExit(3) from None
    ours = [str(w.message) for w in caught if "trainstatus" in w.category.__module__]
    if resume is not None:
        dcp.load(state, checkpoint_id=resume)
    say(event="resumed", rank=rank, path=resume, step=int(state["step"]), w=float(state[mine][0]), warnings=ours)
    start = int(state["step"])
    for step in range(start + 1, start + steps + 1):
        state = {mine: torch.full((4,), float(rank + step)), "step": torch.tensor(step)}
        folder = f"{url}/latest" if mode == "inplace" else f"{url}/step-{step}"
        writer = None
        if die_at == step and rank == 1:
            class Dying(FsspecWriter):  # type: ignore[misc]
                def write_data(self, plan: Any, planner: Any) -> Any:
                    os._exit(9)  # planned with the others, killed before its shard is uploaded

            writer = Dying(folder)
        options = {} if writer is None else {"storage_writer": writer}
        entry = tdcp.save(state, folder, step, keep=2 if mode == "steps" else None, **options)
        say(event="recorded", rank=rank, step=step, files=entry["files"], world_size=entry.get("world_size"))
    if dist.is_initialized():
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
