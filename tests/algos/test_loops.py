"""The two training loops' descriptions of an algorithm (the loops themselves run in every algorithm's tests and in
benchmarks/golden_runs.py)."""

from __future__ import annotations

import pytest

from rlstruct.algos import a2c, dqn, ppo, pqn, reinforce, sac, td3
from rlstruct.algos._train.loops import train_off_policy, train_on_policy
from rlstruct.algos._train.registry import OffPolicyAlgorithm, OnPolicyAlgorithm
from rlstruct.algos._train.session import validate


def test_each_algorithm_describes_itself_to_its_familys_loop():
    for module in (a2c, ppo, reinforce, pqn):
        assert isinstance(module.ALGORITHM, OnPolicyAlgorithm) and module.ALGORITHM.name == module.__name__[15:]
    for module in (dqn, sac, td3):
        assert isinstance(module.ALGORITHM, OffPolicyAlgorithm) and module.ALGORITHM.name == module.__name__[15:]
    assert reinforce.ALGORITHM.episodic and not a2c.ALGORITHM.episodic and not ppo.ALGORITHM.episodic
    assert callable(train_on_policy) and callable(train_off_policy)


def test_an_on_policy_algorithm_takes_its_agents_from_its_model_and_its_collection_from_its_config():
    from rlstruct.algos._train.actor_critic import ACTOR_CRITIC

    for module in (a2c, ppo, reinforce):
        assert module.ALGORITHM.model is ACTOR_CRITIC and module.ALGORITHM.agent is ACTOR_CRITIC.agent
    # PQN names its Q-network once, instead of overriding each of the actor-critic's hooks
    assert pqn.ALGORITHM.model is pqn.Q_NETWORK and pqn.ALGORITHM.agent is pqn.Q_NETWORK.agent
    assert pqn.ALGORITHM.evaluation_info is pqn.Q_NETWORK.evaluation_info
    assert pqn.ALGORITHM.evaluation_agent_info({"epsilon_end": 0.05}, "sample") == {"epsilon": 0.05}
    with pytest.raises(TypeError, match="unexpected keyword argument 'agent'"):
        OnPolicyAlgorithm(name="x", title="X", config_cls=a2c.A2CConfig, description="", make_learn=print, agent=print)
    # episodic exactly when the config has no collection part
    assert [m.ALGORITHM.episodic for m in (a2c, ppo, reinforce, pqn)] == [False, False, True, False]


@pytest.mark.parametrize("module,change,match", [
    (a2c, {"gae_lambda": 1.5}, r"gae_lambda must lie in \[0, 1\], got 1.5"),
    (ppo, {"gae_lambda": -0.1}, r"gae_lambda must lie in \[0, 1\], got -0.1"),
    (ppo, {"n_epochs": 0}, "n_epochs must be >= 1, got 0"),
    (pqn, {"gamma": 1.5}, r"gamma must lie in \[0, 1\], got 1.5"),
    (dqn, {"tau": 0.0}, r"tau must lie in \(0, 1\], got 0.0"),
    (dqn, {"loss": "l1"}, "loss must be 'huber' or 'mse', got 'l1'"),
    (sac, {"replay_storage": "tape"}, "replay_storage must be 'memory' or 'disk', got 'tape'"),
    (td3, {"batch_size": 0}, "batch_size must be >= 1, got 0"),
    (dqn, {"epsilon_end": 1.5}, r"epsilon_end must lie in \[0, 1\], got 1.5"),
    (a2c, {"n_evaluation_processes": -1}, "n_evaluation_processes must be >= 0, got -1"),
])
def test_the_settings_of_a_part_or_a_family_are_checked_for_every_algorithm_made_of_it(module, change, match):
    config_cls = module.ALGORITHM.config_cls
    with pytest.raises(ValueError, match=match):
        validate(module.ALGORITHM, config_cls(**change))


def test_a_setting_declares_the_values_it_takes_and_a_redeclared_default_keeps_them():
    import dataclasses

    from rlstruct.algos._train.config import check_bounds, default, setting

    @dataclasses.dataclass
    class Config(a2c.A2CConfig):
        n_steps: int = default(4)

    check_bounds(Config())
    with pytest.raises(ValueError, match="n_steps must be >= 1, got 0"):
        check_bounds(Config(n_steps=0))
    with pytest.raises(ValueError, match=r"within must be '\[0, 1\]', '\(0, 1\]' or None, got '\[0, 2\]'"):
        setting(0.5, "a weight", within="[0, 2]")


def test_a_description_without_its_learn_step_is_a_type_error():
    from rlstruct.algos._train.actor_critic import ACTOR_CRITIC

    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'make_learn'"):
        OnPolicyAlgorithm(name="x", title="X", config_cls=a2c.A2CConfig, description="", model=ACTOR_CRITIC)
    with pytest.raises(TypeError, match="missing 1 required keyword-only argument: 'make_learner'"):
        OffPolicyAlgorithm(name="y", title="Y", config_cls=dqn.DQNConfig, description="", agent=print,
                           evaluation_info=print)


def test_a_description_is_data_that_the_harness_functions_take(capsys):
    import functools

    from rlstruct.algos._train import loops, train_command
    from rlstruct.algos._train.actor_critic import check_actor_critic_env
    from rlstruct.algos._train.session import Setup

    # an actor-critic's envs are checked by its model unless the algorithm gives its own check (REINFORCE does)
    check = a2c.ALGORITHM.check_env
    assert isinstance(check, functools.partial) and check.func is check_actor_critic_env and check.args == ("A2C",)
    assert reinforce.ALGORITHM.check_env is reinforce.check_env
    assert not hasattr(a2c.ALGORITHM, "train") and not hasattr(a2c.ALGORITHM, "validate")
    assert a2c.train.__name__ == "train" and a2c.train.__module__ == "rlstruct.algos.a2c"
    assert train_command.main("a2c", ["--lr", "-1"]) == 2  # by its name in the registry, as `python -m` runs it
    # run() trains in the loop the description carries, whatever its family
    setup = Setup(_plain_description(), a2c.A2CConfig(), None, None, None, 0.0)
    assert loops.run(setup) == ("trained", setup, None)
    assert "rlstruct train a2c: error: lr must be > 0" in capsys.readouterr().err


def test_the_public_train_and_validate_take_any_algorithms_config_and_refuse_another_object(tmp_path):
    import rlstruct.algos

    setup = rlstruct.algos.validate(ppo.PPOConfig(env="Pendulum-v1", logdir=str(tmp_path / "run")))
    assert setup.algorithm is ppo.ALGORITHM and setup.config.preset == "ppo-pendulum"
    for function in (rlstruct.algos.train, rlstruct.algos.validate):
        with pytest.raises(TypeError, match=r"config must be an algorithm's config \(ReinforceConfig, .*got dict"):
            function({"env": "CartPole-v1"})


def _plain_description():
    from rlstruct.algos._train.registry import Algorithm

    return Algorithm(name="x", title="X", config_cls=a2c.A2CConfig, description="", agent=print,
                     evaluation_info=print, loop=lambda setup, *, timer=None: ("trained", setup, timer))


def test_the_registry_lists_every_algorithm_and_names_its_exports():
    from rlstruct.algos._train.registry import ALGORITHMS, algorithm, exports

    assert [algorithm(name).name for name in ALGORITHMS] == list(ALGORITHMS)
    assert exports()["PPOConfig"] == "rlstruct.algos.ppo"
    with pytest.raises(ValueError, match=r"unknown algorithm 'nope'; expected one of \['reinforce'"):
        algorithm("nope")


def test_validate_checks_once_and_hands_down_what_it_found():
    setup = validate(a2c.ALGORITHM, a2c.A2CConfig(env="Pendulum-v1"))
    assert setup.algorithm is a2c.ALGORITHM and setup.resume is None
    assert setup.spec.action_shape == (1,) and str(setup.learner_device) == "cpu"


def test_a_workers_failure_in_an_iteration_is_recorded_with_the_traceback_it_sent_and_stops_the_run():
    """What the loops do with a batcher worker's failure (no restart left): the block ends, the failure is kept
    (its first line, and the traceback the worker sent, for the summary) and the run stops at its next check; the
    first failure is the one kept. Any other error still propagates."""
    from rlstruct.algos._env_spec import EnvSpec
    from rlstruct.algos._train.config import RunConfig
    from rlstruct.algos._train.stop_rule import StopRule
    from rlstruct.algos.harness import until_a_worker_fails
    from rlstruct.errors import BatcherWorkerError

    rule = StopRule(RunConfig(), EnvSpec((4,), "float32", 2, 500), clock=lambda: 0.0)
    sent = "Traceback (most recent call last):\n  ...\nValueError: bad state\n"
    with until_a_worker_fails(rule):
        raise BatcherWorkerError(f"worker 1 raised ValueError: bad state\n--- traceback in worker 1 ---\n{sent}",
                                 worker_id=1, remote_traceback=sent)
    with until_a_worker_fails(rule):
        raise BatcherWorkerError("worker 0 (pid 7) was killed by SIGKILL without answering", worker_id=0)
    assert rule.worker_failure == {"worker_id": 1, "error": "worker 1 raised ValueError: bad state", "traceback": sent}
    with pytest.raises(ValueError, match="not a worker's"), until_a_worker_fails(rule):
        raise ValueError("not a worker's")
    assert rule.should_stop(0) and rule.reason == "worker_failed"
