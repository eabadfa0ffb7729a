"""Adapters that give training libraries trainstatus's checkpoint promise, one module per library.

- ``trainstatus.integrations.sb3``: Stable-Baselines3 (``pip install "trainstatus[sb3]"``).
- ``trainstatus.integrations.lightning``: PyTorch Lightning (``pip install "trainstatus[lightning]"``).
- ``trainstatus.integrations.transformers``: Hugging Face Transformers' ``Trainer``
  (``pip install "trainstatus[transformers]"``).
- ``trainstatus.integrations.accelerate``: Hugging Face Accelerate's ``save_state`` and ``load_state``
  (``pip install "trainstatus[accelerate]"``).
- ``trainstatus.integrations.dcp``: ``torch.distributed.checkpoint`` (``pip install "trainstatus[dcp]"``).
- ``trainstatus.integrations.deepspeed``: DeepSpeed's engine, for loops that call it themselves
  (``pip install "trainstatus[deepspeed]"``).
- ``trainstatus.integrations.ray``: Ray Train v2's controller (``pip install "trainstatus[ray]"``).

Each module imports its library at the top (``dcp`` when it reads a checkpoint; ``deepspeed`` never: the
engine is the caller's) and is imported only by its users: this package imports
nothing, so ``import trainstatus`` and ``import trainstatus.integrations`` never load torch or any
training library.
"""
