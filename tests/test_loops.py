"""The two training loops' descriptions of an algorithm (the loops themselves run in every algorithm's tests and in
benchmarks/golden_runs.py)."""

from __future__ import annotations

import pytest

from rlstruct.algos import a2c, dqn, ppo, pqn, reinforce, sac
from rlstruct.algos.off_policy import OffPolicyAlgorithm, train_off_policy
from rlstruct.algos.on_policy import OnPolicyAlgorithm, train_on_policy


def test_each_algorithm_describes_itself_to_its_familys_loop():
    for module in (a2c, ppo, reinforce, pqn):
        assert isinstance(module.ALGORITHM, OnPolicyAlgorithm) and module.ALGORITHM.name == module.__name__[15:]
    for module in (dqn, sac):
        assert isinstance(module.ALGORITHM, OffPolicyAlgorithm) and module.ALGORITHM.name == module.__name__[15:]
    assert reinforce.ALGORITHM.episodic and not a2c.ALGORITHM.episodic and not ppo.ALGORITHM.episodic
    assert callable(train_on_policy) and callable(train_off_policy)


def test_a_description_without_its_learn_step_is_a_type_error():
    with pytest.raises(TypeError, match="OnPolicyAlgorithm 'x' needs make_learn, got None"):
        OnPolicyAlgorithm(name="x", title="X", config_cls=a2c.A2CConfig, description="")
    with pytest.raises(TypeError, match="OffPolicyAlgorithm 'y' needs make_learner, got None"):
        OffPolicyAlgorithm(name="y", title="Y", config_cls=dqn.DQNConfig, description="")


def test_validate_checks_once_and_hands_down_what_it_found():
    setup = a2c.validate(a2c.A2CConfig(env="Pendulum-v1"))
    assert setup.algorithm is a2c.ALGORITHM and setup.resume is None
    assert setup.spec.action_shape == (1,) and str(setup.learner_device) == "cpu"
