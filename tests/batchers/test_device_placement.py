"""Device placement of the learner, the training batcher and the evaluation batcher.

Every agent (the batchers', and the learner's replay) is wrapped in RL_Agent_CheckDevice with
``check_devices=True``: a tensor on the wrong device raises DeviceMismatchError. Without a GPU the three
roles share the CPU, so the tests also show that a deliberately misplaced tensor (on the ``meta`` device)
is caught. The ``cuda`` variants put the roles on different devices for real.
"""

from __future__ import annotations

import pytest
import torch

import rlstruct.agents.check_device as check_device_module
from rlstruct import DictTensor, RL_Agent_CheckDevice
from rlstruct.algos import EnvSpec, a2c, create_env, dqn, reinforce
from rlstruct.algos._train.session import check_on_device
from rlstruct.algos.networks import ActorCritic
from rlstruct.algos.policies import PolicyAgent, create_policy_agent
from rlstruct.batchers import RL_Batcher
from rlstruct.devices import cpu_state_dict
from rlstruct.errors import BatcherWorkerError, DeviceMismatchError

ALGOS = {
    "reinforce": (reinforce, {"max_episode_steps": 40}),
    "a2c": (a2c, {"n_steps": 4}),
    "dqn": (dqn, {"rollout_steps": 4, "learning_starts": 16, "gradient_steps": 2, "batch_size": 8}),
}


def tiny_config(algo: str, tmp_path, learner: str, batcher: str, evaluation: str, **kw):
    module, extra = ALGOS[algo]
    cfg_cls = {"reinforce": reinforce.ReinforceConfig, "a2c": a2c.A2CConfig, "dqn": dqn.DQNConfig}[algo]
    return module, cfg_cls(
        learner_device=learner, batcher_device=batcher, evaluation_device=evaluation, check_devices=True,
        n_envs=3, n_evaluation_envs=2, max_env_steps=120, eval_every=2, hidden_sizes=(8,), progress=False,
        tensorboard=False, logdir=str(tmp_path), **{**extra, **kw},
    )


@pytest.fixture
def checks(monkeypatch):
    """Records every (method, argument, expected device) that RL_Agent_CheckDevice verified."""
    seen: list[tuple[str, str, str]] = []
    original = check_device_module._check

    def recording(method, argument, value, expected, fix):
        if value is not None:
            seen.append((method, argument, str(expected)))
        return original(method, argument, value, expected, fix)

    monkeypatch.setattr(check_device_module, "_check", recording)
    return seen


@pytest.mark.slow  # 2.1 CPU s on the reference CPU: slow is 1.5 s or more
@pytest.mark.timeout(120)
@pytest.mark.parametrize("algo", list(ALGOS))
def test_learner_and_both_batchers_keep_their_tensors_in_place(algo, tmp_path, checks):
    module, cfg = tiny_config(algo, tmp_path, "cpu", "cpu", "cpu")
    result = module.train(cfg)
    assert result.env_steps >= 120
    methods = {(m, a) for m, a, _ in checks}
    # The batchers' agents saw their observations and returned their actions on their device...
    assert ("__call__", "observation") in methods and ("__call__", "the returned action") in methods
    assert ("__call__", "agent_info") in methods
    if algo != "dqn":
        # ...and the learner replayed its forward pass through the checker, on the learner device.
        assert ("call_replay", "trajectories.trajectories") in methods
    assert all(dev == "cpu" for m, a, dev in checks)


@pytest.mark.timeout(120)
def test_worker_process_agents_are_checked_too(tmp_path):
    _, cfg = tiny_config("a2c", tmp_path, "cpu", "cpu", "cpu", n_processes=1, n_evaluation_processes=1)
    result = a2c.train(cfg)
    assert result.env_steps >= 120 and result.eval_return > 0


# --------------------------------------------------------------------------- misplaced tensors are caught
def _small_trajectories() -> "rlstruct.Trajectories":  # noqa: F821
    agent_args = {"spec": EnvSpec((4,), "float32", 2, 500), "hidden_sizes": (8,)}
    with RL_Batcher(3, create_policy_agent, agent_args, create_env,
                    {"name": "CartPole-v1", "n_envs": 2, "autoreset": True}, 0, [0]) as b:
        b.reset()
        b.execute()
        traj, _ = b.get()
    return traj


def test_learner_replay_of_trajectories_left_on_another_device_is_caught():
    traj = _small_trajectories()
    agent = RL_Agent_CheckDevice(PolicyAgent(ActorCritic(4, 2, (8,)), "cpu"), "cpu")
    agent.call_replay(traj, 0, None)  # in place: fine
    with pytest.raises(DeviceMismatchError, match="call_replay: trajectories.trajectories must be on cpu, got meta"):
        agent.call_replay(traj.to("meta"), 0, None)


def test_batcher_agent_observation_on_another_device_is_caught():
    agent = create_policy_agent(EnvSpec((4,), "float32", 2, 500), (8,), device="cpu", check_device=True)
    obs = DictTensor({"frame": torch.zeros(2, 4, device="meta")})
    with pytest.raises(DeviceMismatchError, match="__call__: observation must be on cpu, got meta"):
        agent(DictTensor({}), obs, DictTensor({}))


class _LeakyAgent(PolicyAgent):
    """A device bug on purpose: the action is returned on the ``meta`` device."""

    def __call__(self, state, observation, agent_info, history=None):
        action, state = super().__call__(state, observation, agent_info, history)
        return DictTensor({"action": action["action"].to("meta")}), state


def _create_leaky_agent(device: str = "cpu"):
    return RL_Agent_CheckDevice(_LeakyAgent(ActorCritic(4, 2, (8,)), device), device)


def test_batcher_agent_returning_an_action_elsewhere_is_caught():
    with pytest.raises(BatcherWorkerError, match="the returned action must be on cpu, got meta"):
        RL_Batcher(3, _create_leaky_agent, {}, create_env, {"name": "CartPole-v1", "n_envs": 2}, 0, [0])


def test_learner_model_on_another_device_is_caught():
    model = ActorCritic(4, 2, (8,))
    check_on_device(model, "cpu", "the learner's model")
    with pytest.raises(DeviceMismatchError, match="the learner's model must be on cpu, got meta"):
        check_on_device(model.to("meta"), "cpu", "the learner's model")


def test_dqn_trajectories_on_another_device_are_caught():
    traj = _small_trajectories()
    check_on_device(traj, "cpu", "the trajectories given to the learner")
    with pytest.raises(DeviceMismatchError, match="trajectories given to the learner must be on cpu, got meta"):
        check_on_device(traj.to("meta"), "cpu", "the trajectories given to the learner")


# --------------------------------------------------------------------------- real GPUs
@pytest.mark.cuda
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", list(ALGOS))
@pytest.mark.parametrize("learner, batcher, evaluation", [("cuda:0", "cpu", "cuda:0"), ("cpu", "cuda:0", "cpu")])
def test_one_gpu_and_the_cpu(algo, learner, batcher, evaluation, tmp_path, checks):
    # The training batcher runs in a worker process (a CPU worker, or the GPU worker); the in-process
    # evaluation batcher's and the learner's checks are recorded here.
    module, cfg = tiny_config(algo, tmp_path, learner, batcher, evaluation, n_processes=1)
    module.train(cfg)
    seen = {(m, dev) for m, _, dev in checks}
    assert ("__call__", evaluation) in seen
    if algo != "dqn":
        assert ("call_replay", learner) in seen


@pytest.mark.cuda
@pytest.mark.timeout(300)
@pytest.mark.parametrize("algo", list(ALGOS))
def test_three_roles_on_three_devices(algo, tmp_path):
    if torch.cuda.device_count() < 2:
        pytest.skip("needs two GPUs")
    module, cfg = tiny_config(algo, tmp_path, "cuda:0", "cuda:1", "cpu", n_processes=1, n_evaluation_processes=1)
    result = module.train(cfg)
    assert result.env_steps >= 120


def test_cpu_state_dict_is_a_cpu_copy():
    model = ActorCritic(4, 2, (8,))
    weights = cpu_state_dict(model)
    assert all(v.device.type == "cpu" for v in weights.values())
    before = {k: v.clone() for k, v in weights.items()}
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)
    # The evaluator keeps these weights while training changes the model: they must not move with it.
    assert all(torch.equal(weights[k], before[k]) for k in weights)
