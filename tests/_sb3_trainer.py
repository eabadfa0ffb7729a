"""A real Stable-Baselines3 run for tests/test_integration_sb3.py, run by .venv-torch's interpreter.

    python _sb3_trainer.py '<json options>'

Resumes from ``last_complete_checkpoint(dir)`` when it finds one (``PPO.load``, or ``DQN.load``
with ``"algo": "dqn"``), else starts fresh; with ``"sb3_dir"`` it also tries SB3's usual resume,
the newest ``*.zip`` of that folder by modification time, loaded the same way. Then it trains
``steps`` more timesteps (``reset_num_timesteps=False``) with ``TrainStatusCheckpointCallback`` on
``dir`` and, with ``"sb3_dir"``, SB3's own ``CheckpointCallback`` on ``sb3_dir`` (same model, same
moments). With ``"fresh": true`` it starts a new model whatever ``last_complete_checkpoint`` found.
It prints one JSON object a line, flushed: ``resumed`` (path, steps, warnings, where), ``glob``
(path, ok, error), ``ready`` just before training, ``done`` (steps; warnings and where of the
training) at the end. ``where`` says where each warning points (file:line).
"""

from __future__ import annotations

import glob
import json
import os
import sys
import warnings
from typing import Any


def say(**fields: Any) -> None:
    print(json.dumps(fields), flush=True)


def ours(caught: list[warnings.WarningMessage]) -> list[str]:
    return [f"{w.category.__name__}: {w.message}" for w in caught
            if w.category.__name__ == "TrainingStatusCheckpointWarning"]


def where(caught: list[warnings.WarningMessage]) -> list[str]:
    """Where each of ``ours`` points: file name and line (the lines marked "the user's call")."""
    return [f"{os.path.basename(w.filename)}:{w.lineno}" for w in caught
            if w.category.__name__ == "TrainingStatusCheckpointWarning"]


def main() -> None:
    options = json.loads(sys.argv[1])
    import gymnasium as gym
    import torch
    from stable_baselines3 import DQN, PPO
    from stable_baselines3.common.callbacks import CallbackList, CheckpointCallback
    from stable_baselines3.common.vec_env import DummyVecEnv, VecNormalize

    from trainstatus.integrations.sb3 import TrainStatusCheckpointCallback, last_complete_checkpoint

    torch.set_num_threads(1)  # two cores shared by the suite: one each for trainer and checker
    algo = DQN if options.get("algo") == "dqn" else PPO
    env: Any = DummyVecEnv([lambda: gym.make("CartPole-v1")])
    if options.get("vecnormalize"):
        env = VecNormalize(env)
    width = options.get("width", 32)
    directory = options["dir"]
    prefix = options.get("name_prefix", "rl_model")

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        status_path = options.get("status_path")
        path = last_complete_checkpoint(directory, name_prefix=prefix, status_path=status_path)  # the user's call
    if options.get("fresh"):
        path = None
    if path is not None:
        model = algo.load(path, env=env, device="cpu")
    elif algo is PPO:
        model = PPO("MlpPolicy", env, n_steps=64, batch_size=64, n_epochs=1, seed=options.get("seed", 0),
                    policy_kwargs={"net_arch": [width, width]}, device="cpu")
    else:
        model = DQN("MlpPolicy", env, learning_starts=32, buffer_size=2000, train_freq=8, seed=0,
                    policy_kwargs={"net_arch": [width]}, device="cpu")
    say(event="resumed", path=path, steps=model.num_timesteps, warnings=ours(caught), where=where(caught))

    sb3_dir = options.get("sb3_dir")
    if sb3_dir is not None:
        zips = glob.glob(os.path.join(sb3_dir, "*.zip"))
        newest = max(zips, key=os.path.getmtime) if zips else None
        ok, error = None, None
        if newest is not None:
            try:
                algo.load(newest, device="cpu")
                ok = True
            except Exception as exc:  # what SB3's usual resume would crash on
                ok, error = False, f"{type(exc).__name__}: {exc}"
        say(event="glob", path=newest, ok=ok, error=error)

    callbacks: list[Any] = []
    if sb3_dir is not None:
        callbacks.append(CheckpointCallback(options["save_freq"], sb3_dir, name_prefix=prefix,
                                            save_replay_buffer=options.get("save_replay_buffer", False),
                                            save_vecnormalize=options.get("save_vecnormalize", False)))
    callbacks.append(TrainStatusCheckpointCallback(
        options["save_freq"], directory, name_prefix=prefix, keep=options.get("keep"),
        save_replay_buffer=options.get("save_replay_buffer", False),
        save_vecnormalize=options.get("save_vecnormalize", False), status_path=options.get("status_path")))
    say(event="ready")
    with warnings.catch_warnings(record=True) as learning:
        warnings.simplefilter("always")
        if options.get("steps", 0):
            model.learn(options["steps"], callback=CallbackList(callbacks), reset_num_timesteps=False)  # the user's call
    say(event="done", steps=model.num_timesteps, warnings=ours(learning), where=where(learning))


if __name__ == "__main__":
    main()
