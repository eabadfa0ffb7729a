"""Stable-Baselines3 PPO with a curriculum, resumable after a kill at any moment.

CartPole's episodes are cut at a length that grows lesson by lesson (LESSONS), as an ML-Agents
curriculum moves an environment parameter on. The checkpoints go through trainstatus's
``TrainStatusCheckpointCallback``, and the lesson is kept in the same status file
(``<dir>/training_status.json``, category ``cartpole``, key ``lesson``) with ``StatusStore``. The
lesson moves on only right after a checkpoint is recorded, so it never runs ahead of the newest
checkpoint (if a resume has to fall back past a damaged newest checkpoint, it is one lesson ahead
of the model it loads: keep the lesson per checkpoint step if that matters to you). Run it, kill it (Ctrl-C, ``kill -9``), run it again: it resumes from the newest
complete checkpoint at the lesson it had reached.

Needs ``pip install torch`` (the build for your machine) and ``pip install "trainstatus[sb3]"``.

Run: python examples/sb3_curriculum.py --dir runs/cartpole --steps 20000
"""

from __future__ import annotations

import argparse
from typing import Any

import gymnasium as gym
from stable_baselines3 import PPO
from stable_baselines3.common.callbacks import BaseCallback, CallbackList
from stable_baselines3.common.env_util import make_vec_env

from trainstatus import StatusStore
from trainstatus.integrations.sb3 import TrainStatusCheckpointCallback, last_complete_checkpoint

LESSONS = [10, 20, 40, 80, 500]  # the episode length limit of each lesson
PASS = 0.8  # a lesson is passed when the mean episode reward reaches 80% of its limit
CURRICULUM = ("cartpole", "lesson")  # where the lesson lives in the status file


class LessonLimit(gym.Wrapper):
    """Cut episodes at the current lesson's length (the environment parameter)."""

    def __init__(self, env: gym.Env, lesson: int) -> None:
        super().__init__(env)
        self.set_lesson(lesson)

    def set_lesson(self, lesson: int) -> None:
        self.limit = LESSONS[lesson]

    def reset(self, **kwargs: Any) -> Any:
        self.length = 0
        return self.env.reset(**kwargs)

    def step(self, action: Any) -> Any:
        observation, reward, terminated, truncated, info = self.env.step(action)
        self.length += 1
        return observation, reward, terminated, truncated or self.length >= self.limit, info


class Curriculum(BaseCallback):
    """Move the lesson on after a checkpoint, once the mean episode reward passes; keep it on disk."""

    def __init__(self, store: StatusStore, save_freq: int, lesson: int) -> None:
        super().__init__()
        self.store, self.save_freq, self.lesson = store, save_freq, lesson

    def _on_step(self) -> bool:
        # Placed after the checkpoint callback: at this call the checkpoint of this step is recorded.
        if self.n_calls % self.save_freq != 0 or self.lesson == len(LESSONS) - 1:
            return True
        rewards = [info["r"] for info in self.model.ep_info_buffer]
        if len(rewards) >= 10 and sum(rewards) / len(rewards) >= PASS * LESSONS[self.lesson]:
            self.lesson += 1
            self.store.set(*CURRICULUM, self.lesson)  # on disk when set() returns
            self.training_env.env_method("set_lesson", self.lesson)
            print(f"lesson {self.lesson} at step {self.num_timesteps}", flush=True)
        return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--dir", default="runs/cartpole", help="the checkpoints' folder (save_path)")
    parser.add_argument("--steps", type=int, default=20_000, help="timesteps to train in this run")
    parser.add_argument("--save-freq", type=int, default=512)
    args = parser.parse_args()

    store = StatusStore(f"{args.dir}/training_status.json")
    lesson = int(store.get(*CURRICULUM, 0))
    env = make_vec_env("CartPole-v1", wrapper_class=LessonLimit, wrapper_kwargs={"lesson": lesson}, seed=0)

    path = last_complete_checkpoint(args.dir)
    model = PPO.load(path, env=env) if path else PPO("MlpPolicy", env, n_steps=256, batch_size=64, seed=0)
    print(f"resumed from {path} at step {model.num_timesteps}, lesson {lesson}", flush=True)
    checkpoints = TrainStatusCheckpointCallback(args.save_freq, args.dir, keep=3)
    model.learn(args.steps, callback=CallbackList([checkpoints, Curriculum(store, args.save_freq, lesson)]),
                reset_num_timesteps=False)
    print(f"trained to step {model.num_timesteps}, lesson {int(store.get(*CURRICULUM, 0))}", flush=True)
    store.close()


if __name__ == "__main__":
    main()
