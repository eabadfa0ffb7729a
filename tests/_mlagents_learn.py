"""``mlagents-learn`` with a small environment of the suite's own in place of the Unity player.

Run by tests/test_mlagents_learn.py with the interpreter of ``.venv-mlagents-torch/``
(tests/_mlagents_env.py), with ``mlagents-learn``'s own arguments::

    python tests/_mlagents_learn.py config.yaml --run-id run --results-dir results [--resume]

Everything is ML-Agents 1.1.0's real training path, unmodified: ``learn.main()`` parses the command
line (loading the plugins' entry points, trainstatus's among them), ``run_training`` reads the
status of a ``--resume`` run, the ``SubprocessEnvManager`` runs the environment in a worker
process, the ``TrainerController`` trains PPO (torch), the curriculum moves through its lessons,
the checkpoint manager records checkpoints (``.pt`` and ``.onnx`` exported by torch) and removes
those beyond ``keep_checkpoints``.

The one thing replaced is where the environment comes from. ``learn.run_training`` calls
``create_environment_factory(env_path, ...)``, whose factory starts a Unity player (or, with no
``--env``, waits for the Unity editor to connect); this module sets that module-level name to a
function returning :func:`make_env`, before calling ``learn.main()``. The worker process that
``SubprocessEnvManager`` forks calls it with its side channels, as it would call Unity's.
(ML-Agents' own ``SimpleEnvironment`` lives in its tests folder, which its wheel does not ship.)
"""

from __future__ import annotations

import sys
from collections.abc import Mapping
from typing import Any

import numpy as np
from mlagents_envs.base_env import (
    ActionSpec,
    ActionTuple,
    BaseEnv,
    BehaviorMapping,
    BehaviorSpec,
    DecisionSteps,
    DimensionProperty,
    ObservationSpec,
    ObservationType,
    TerminalSteps,
)

BEHAVIOR = "Target"
ACTIONS = 3
EPISODE = 4  # decisions per episode


class TargetEnv(BaseEnv):
    """One agent; the observation is a one-hot target, reward 1 when the discrete action hits it.

    An episode is ``EPISODE`` decisions; each new episode gets a new agent id, the way ML-Agents'
    agent processor expects a finished agent (reported in ``TerminalSteps``) to be gone.
    """

    academy_capabilities = None  # the worker sends no training analytics to an environment without them

    def __init__(self, seed: int) -> None:
        self._rng = np.random.default_rng(seed)
        obs = ObservationSpec(shape=(ACTIONS,), dimension_property=(DimensionProperty.NONE,),
                              observation_type=ObservationType.DEFAULT, name="target")
        self._specs = BehaviorMapping({BEHAVIOR: BehaviorSpec([obs], ActionSpec.create_discrete((ACTIONS,)))})
        self._agent = 0
        self._action = 0
        self.reset()

    def _new_episode(self) -> None:
        self._agent += 1
        self._decisions = 0
        self._reward = 0.0
        self._target = int(self._rng.integers(ACTIONS))

    def _obs(self) -> list[np.ndarray]:
        return [np.eye(ACTIONS, dtype=np.float32)[self._target][None, :]]

    @property
    def behavior_specs(self) -> Mapping[str, BehaviorSpec]:
        return self._specs

    def reset(self) -> None:
        self._new_episode()
        self._ended: tuple[int, float, list[np.ndarray]] | None = None

    def set_actions(self, behavior_name: str, action: ActionTuple) -> None:
        self._action = int(action.discrete[0, 0])

    def set_action_for_agent(self, behavior_name: str, agent_id: int, action: ActionTuple) -> None:
        self._action = int(action.discrete[0, 0])

    def step(self) -> None:
        reward = 1.0 if self._action == self._target else 0.0
        self._decisions += 1
        self._ended = None
        if self._decisions >= EPISODE:
            self._ended = (self._agent, reward, self._obs())
            self._new_episode()
        else:
            self._reward = reward
            self._target = int(self._rng.integers(ACTIONS))

    def get_steps(self, behavior_name: str) -> tuple[DecisionSteps, TerminalSteps]:
        groups, group_rewards = np.zeros(1, dtype=np.int32), np.zeros(1, dtype=np.float32)
        decisions = DecisionSteps(self._obs(), np.array([self._reward], dtype=np.float32),
                                  np.array([self._agent], dtype=np.int32), None, groups, group_rewards)
        if self._ended is None:
            return decisions, TerminalSteps.empty(self._specs[behavior_name])
        agent, reward, obs = self._ended
        terminal = TerminalSteps(obs, np.array([reward], dtype=np.float32), np.zeros(1, dtype=bool),
                                 np.array([agent], dtype=np.int32), groups, group_rewards)
        return decisions, terminal

    def close(self) -> None:
        pass


def make_env(worker_id: int, side_channels: list[Any]) -> BaseEnv:
    """What ``SubprocessEnvManager``'s worker calls in place of Unity's factory."""
    return TargetEnv(seed=worker_id)


def main() -> None:
    from mlagents.trainers import learn

    learn.create_environment_factory = lambda *args, **kwargs: make_env  # the one replacement
    learn.main()


if __name__ == "__main__":
    sys.exit(main())
