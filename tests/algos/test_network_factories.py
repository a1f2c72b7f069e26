"""``--network MODULE:CALLABLE``: a factory of the user's, called with the env's spec, builds every family's model; a
model the family cannot use is refused at setup in one line naming what the family needs, and a saved run rebuilds
the network in a fresh process (or names the module it cannot import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest
import torch

from rlstruct.algos import EnvSpec
from rlstruct.algos.network_factories import (
    ACTOR_CRITIC_CONTRACT,
    Q_CONTRACT,
    SAC_CONTRACT,
    TD3_CONTRACT,
    check_network,
    network_model,
)
from rlstruct.algos.networks import build_actor_critic
from rlstruct.algos.qnetworks import q_network
from rlstruct.algos.sac import SquashedGaussianActor, TwinQNetwork
from rlstruct.algos.td3 import DeterministicActor
from rlstruct.errors import ConfigError
from tests.algos.test_cli_errors import assert_one_line_error, run_cli
from tests.helpers import user_module

NETS = textwrap.dedent('''
    """Networks of a lab's own, outside the package."""
    from torch import nn

    from rlstruct.algos.distributions import Categorical
    from rlstruct.algos.sac import SquashedGaussianActor, TwinQNetwork
    from rlstruct.algos.td3 import DeterministicActor


    class SharedTrunk(nn.Module):
        """An actor-critic whose policy and value share one trunk."""

        def __init__(self, spec):
            super().__init__()
            self.continuous, self.policy_dim = False, spec.n_actions
            self.trunk = nn.Sequential(nn.Linear(spec.obs_dim, 32), nn.Tanh())
            self.pi, self.v = nn.Linear(32, spec.n_actions), nn.Linear(32, 1)

        def policy(self, frame):
            return Categorical(self.pi(self.trunk(frame.float())))

        def value(self, frame):
            return self.v(self.trunk(frame.float())).squeeze(-1)

        def policy_value(self, frame):
            return self.policy(frame), self.value(frame)


    def actor_critic(spec):
        return SharedTrunk(spec)


    def q(spec):
        return nn.Sequential(nn.Linear(spec.obs_dim, 32), nn.ReLU(), nn.Linear(32, spec.n_actions))


    def sac(spec):
        return (SquashedGaussianActor(spec.obs_dim, spec.action_dim, (32,), spec.action_low, spec.action_high),
                TwinQNetwork(spec.obs_dim, spec.action_dim, (32,)))


    def td3(spec):
        return (DeterministicActor(spec.obs_dim, spec.action_dim, (32,), spec.action_low, spec.action_high),
                TwinQNetwork(spec.obs_dim, spec.action_dim, (32,)))


    def three_outputs(spec):
        return nn.Linear(spec.obs_dim, 3)


    def broken(spec):
        raise RuntimeError("the lab's factory is broken")

    NOT_CALLABLE = 3
''')
CARTPOLE = EnvSpec((4,), "float32", 2, 500)
PENDULUM = EnvSpec((3,), "float32", None, 200, action_shape=(1,), action_low=(-2.0,), action_high=(2.0,))


@pytest.fixture
def labnets(tmp_path, monkeypatch):
    with user_module(tmp_path, "labnets", NETS, monkeypatch) as name:
        yield name


@pytest.mark.parametrize(("spec", "contract", "model"), [
    (CARTPOLE, ACTOR_CRITIC_CONTRACT, lambda s: build_actor_critic(s, (8,))),
    (PENDULUM, ACTOR_CRITIC_CONTRACT, lambda s: build_actor_critic(s, (8,))),
    (CARTPOLE, Q_CONTRACT, lambda s: q_network(s, (8,))),
    (PENDULUM, SAC_CONTRACT, lambda s: (SquashedGaussianActor(3, 1, (8,), s.action_low, s.action_high),
                                        TwinQNetwork(3, 1, (8,)))),
    (PENDULUM, TD3_CONTRACT, lambda s: (DeterministicActor(3, 1, (8,), s.action_low, s.action_high),
                                        TwinQNetwork(3, 1, (8,)))),
])
def test_the_built_in_networks_meet_their_familys_contract(spec, contract, model):
    assert contract.problem(model(spec), spec) is None


def test_the_factory_is_called_with_the_envs_spec(labnets):
    model = network_model(f"{labnets}:actor_critic", CARTPOLE)
    assert model.policy_dim == 2 and model.value(torch.zeros(5, 4)).shape == (5,)
    check_network(f"{labnets}:actor_critic", CARTPOLE, ACTOR_CRITIC_CONTRACT, algo="PPO")
    check_network(f"{labnets}:q", CARTPOLE, Q_CONTRACT, algo="DQN")
    check_network(f"{labnets}:sac", PENDULUM, SAC_CONTRACT, algo="SAC")
    check_network(f"{labnets}:td3", PENDULUM, TD3_CONTRACT, algo="TD3")


@pytest.mark.parametrize(("argv", "match"), [
    (["ppo", "--network", "labnets:three_outputs"],
     r"network='labnets:three_outputs' must return an actor-critic torch.nn.Module .* for PPO, got a Linear without "
     r"policy, value, policy_value, continuous, policy_dim"),
    (["a2c", "--network", "labnets:q"], r"must return an actor-critic torch.nn.Module .* for A2C, got a Sequential"),
    (["reinforce", "--network", "labnets:broken"],
     r"for REINFORCE, got an error: RuntimeError: the lab's factory is broken"),
    (["dqn", "--network", "labnets:three_outputs"],
     r"must return a Q-network torch.nn.Module \(frame \[N, \.\.\.\] -> Q-values \[N, n_actions\]\) for DQN, got "
     r"Q-values of shape \[2, 3\] for frames \[2, \.\.\.\], not \[2, 2\]"),
    (["pqn", "--network", "labnets:actor_critic"], r"must return a Q-network .* for PQN, got"),
    (["sac", "--env", "Pendulum-v1", "--network", "labnets:q"], r"must return a pair \(actor, critic\) .* for SAC"),
    (["td3", "--env", "Pendulum-v1", "--network", "labnets:sac"],
     r"must return a pair \(actor, critic\) like rlstruct.algos.td3's .* for TD3, got an actor "
     r"\(SquashedGaussianActor\) without clip;"),
    (["ppo", "--network", "labnets:NOT_CALLABLE"], r"network='labnets:NOT_CALLABLE' names a int, not a callable"),
    (["ppo", "--network", "labnets:nothing"], r"module 'labnets' has no attribute 'nothing'"),
    (["ppo", "--network", "labnets"], r"network must be MODULE:CALLABLE .*, got 'labnets'"),
    (["ppo", "--network", "nolab.nets:make"],
     r"network='nolab.nets:make' names module 'nolab.nets', but no module named 'nolab' imports here; run from the "
     r"folder that holds it, add that folder to PYTHONPATH, or install its package"),
    (["ppo", "--network", "labnets:actor_critic", "--normalize-observations"],
     r"normalize_observations=True shapes PPO's built-in actor-critic, got network='labnets:actor_critic' as well; "
     r"pass --no-normalize-observations \(or --preset none\), or build it into your network"),
    (["a2c", "--network", "labnets:actor_critic", "--recurrent"], r"recurrent=True shapes A2C's built-in"),
])
def test_a_network_the_family_cannot_use_is_refused_in_one_line(labnets, tmp_path, capsys, argv, match):
    import re

    code, lines = run_cli(["train", *argv, "--logdir", str(tmp_path / "run"), "--no-progress"], capsys)
    assert_one_line_error(code, lines, f"rlstruct train {argv[0]}")
    assert re.search(match, lines[0]), lines[0]
    assert not (tmp_path / "run").exists()


def test_a_missing_module_is_a_config_error_naming_it():
    with pytest.raises(ConfigError, match=r"names module 'nolab', but no module named 'nolab' imports here"):
        network_model("nolab:make", CARTPOLE)


#: in a fresh interpreter, with the lab's folder on ``PYTHONPATH`` only: ``rlstruct eval RUN`` and ``rlstruct export
#: RUN --output OUTPUT`` through the command's code, then the actions ``load(RUN).predict`` gives three observations
OPEN_THE_RUN = """
import json, sys
import torch
from rlstruct.algos import load
from rlstruct.algos._train.cli import main
run, output = sys.argv[1:]
for argv in (["eval", run, "--episodes", "4", "--trust-code"], ["export", run, "--output", output, "--trust-code"]):
    if main(argv):
        sys.exit(1)
print(json.dumps(load(run, trust_code=True).predict(torch.zeros(3, 4)).tolist()))
"""


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_network_from_outside_trains_ppo_and_its_saved_run_loads_in_a_fresh_process(tmp_path, capsys,
                                                                                     monkeypatch):
    """The run trains in this process with two worker processes, which import the lab's module by name; a fresh
    interpreter that has only ``PYTHONPATH`` to find it then rebuilds the network for eval (the first import), export
    and ``load``; where the module is nowhere, eval names it in one line."""
    lab, elsewhere = tmp_path / "lab", tmp_path / "elsewhere"
    lab.mkdir(), elsewhere.mkdir()
    (lab / "labnets.py").write_text(NETS)
    run = tmp_path / "run"
    with monkeypatch.context() as patch:
        patch.syspath_prepend(str(lab))
        code, lines = run_cli(["train", "ppo", "--network", "labnets:actor_critic", "--max-env-steps", "1024",
                               "--n-processes", "2", "--logdir", str(run), "--no-progress", "--no-tensorboard"], capsys)
        sys.modules.pop("labnets", None)
    assert code == 0, lines[-20:]
    assert json.loads((run / "config.json").read_text())["network"] == "labnets:actor_critic"
    assert torch.load(run / "checkpoint.pt", weights_only=False)["config"]["network"] == "labnets:actor_critic"
    assert "trunk.0.weight" in torch.load(run / "checkpoint.pt", weights_only=False)["model"]

    env = {**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, "PYTHONPATH": str(lab)}
    opened = subprocess.run([sys.executable, "-c", OPEN_THE_RUN, str(run), str(tmp_path / "policy.pt")],
                            cwd=elsewhere, env=env, capture_output=True, text=True, timeout=240)
    assert opened.returncode == 0, opened.stderr[-3000:]
    printed = [json.loads(line) for line in opened.stdout.splitlines() if line[:1] in "{["]
    assert [p["episodes"] for p in printed if isinstance(p, dict) and "episodes" in p] == [4]
    assert torch.jit.load(str(tmp_path / "policy.pt"))(torch.zeros(3, 4)).shape == (3,)
    assert len(printed[-1]) == 3

    # Without the module: one line that names it.
    monkeypatch.chdir(elsewhere)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command's search of the current folder is undone
    code, lines = run_cli(["eval", str(run), "--episodes", "4", "--trust-code"], capsys)
    assert code == 2, lines
    assert lines == [
        "rlstruct eval: error: network='labnets:actor_critic' names module 'labnets', but no module named 'labnets' "
        "imports here; run from the folder that holds it, add that folder to PYTHONPATH, or install its package"]
