"""Programs written for rlstructures v0.2 run on rlstruct with ``rlstructures`` renamed to ``rlstruct`` (and ``gym``
to ``gymnasium``), nothing else changed.

rlstructures' programs import the package and its submodules: ``rlstructures.core``, ``rlstructures.dicttensor``,
``rlstructures.env``, ``rlstructures.env_wrappers``, ``rlstructures.rl_batchers``, ``rlstructures.logger`` and
``rlstructures.tools``. Each of those paths exists in
rlstruct as a small module re-exporting the same names (:data:`PATHS`). The programs of
``tests/project/rlstructures_programs`` (REINFORCE, REINFORCE on devices, A2C-GAE, PPO, DQN, DIAYN), written the way
rlstructures' example programs are, import rlstruct only through those paths, and run here at a tiny size: in
this process, and with worker processes as rlstructures always ran them.
"""

from __future__ import annotations

import ast
import csv
import importlib
import importlib.util
import json
from pathlib import Path

import pytest
import torch

import rlstruct
from tests.project.rlstructures_programs import a2c_gae, diayn, dqn, ppo, reinforce, reinforce_device

ROOT = Path(__file__).resolve().parents[2]
PROGRAMS = ROOT / "tests" / "project" / "rlstructures_programs"

#: rlstructures' module paths that its programs import -> the public names each held (v0.2).
PATHS = {
    "rlstructures": [
        "masked_tensor", "masked_dicttensor", "DictTensor", "TemporalDictTensor", "Trajectories", "RL_Agent",
        "RL_Agent_CheckDevice", "replay_agent_stateless", "replay_agent", "VecEnv", "RL_Batcher",
    ],
    "rlstructures.core": ["masked_tensor", "masked_dicttensor", "DictTensor", "TemporalDictTensor", "Trajectories"],
    # rlstructures registered this name as an alias of rlstructures.core.
    "rlstructures.dicttensor": ["masked_tensor", "masked_dicttensor", "DictTensor", "TemporalDictTensor",
                                "Trajectories"],
    "rlstructures.env": ["VecEnv"],
    "rlstructures.env_wrappers": ["GymEnv", "GymEnvInf", "DeviceEnv"],
    "rlstructures.rl_batchers": ["RL_Batcher"],
    # rlstructures registered these names as aliases of its example package's rlalgos.logger and rlalgos.tools.
    "rlstructures.logger": ["Logger", "TFLogger"],
    "rlstructures.tools": ["weight_init"],
}
#: where rlstruct defines each name (the one object every path hands out)
HOMES = {"rlstruct.core": "rlstruct.structures", "rlstruct.dicttensor": "rlstruct.structures",
         "rlstruct.env": "rlstruct.envs", "rlstruct.env_wrappers": "rlstruct.envs",
         "rlstruct.rl_batchers": "rlstruct.batchers", "rlstruct.logger": "rlstruct._scalar_logger",
         "rlstruct.tools": "rlstruct._weight_init"}


def renamed(module: str) -> str:
    return "rlstruct" + module.removeprefix("rlstructures")


CASES = [(module, name) for module, names in PATHS.items() for name in names]


@pytest.mark.parametrize("module, name", CASES, ids=[f"{m}.{n}" for m, n in CASES])
def test_every_rlstructures_name_imports_from_its_renamed_path(module, name):
    target = importlib.import_module(renamed(module))
    assert hasattr(target, name), f"from {renamed(module)} import {name} fails (rlstructures: from {module} ...)"
    # A re-export, not a copy: every path hands out the one object.
    if name in rlstruct.__all__:
        assert getattr(target, name) is getattr(rlstruct, name)
    home = HOMES.get(renamed(module))
    if home is not None:
        assert getattr(target, name) is getattr(importlib.import_module(home), name)


@pytest.mark.parametrize("module", [m for m in PATHS if m != "rlstructures"])
def test_each_path_module_exports_exactly_rlstructures_names_and_says_what_it_is(module):
    target = importlib.import_module(renamed(module))
    assert sorted(target.__all__) == sorted(PATHS[module])
    doc = target.__doc__.strip()
    assert "\n" not in doc and doc.startswith(f"rlstructures' ``{module}`` path"), doc


def test_the_coming_from_rlstructures_page_names_every_path():
    page = (ROOT / "docs" / "rlstructures.md").read_text()
    for module in PATHS:
        assert f"`{module}`" in page and f"`{renamed(module)}`" in page, module


# ------------------------------------------------------------------------ the programs


def rlstruct_imports(path: Path) -> list[tuple[str, str]]:
    """``(module, name)`` of every ``from rlstruct... import name`` in a program (``import rlstruct...`` as
    ``(module, "")``)."""
    found = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "rlstruct":
            found += [(node.module, a.name) for a in node.names]
        elif isinstance(node, ast.Import):
            found += [(a.name, "") for a in node.names if a.name.split(".")[0] == "rlstruct"]
    return found


@pytest.mark.parametrize("program", sorted(p.name for p in PROGRAMS.glob("*.py") if p.name != "__init__.py"))
def test_the_programs_reach_rlstruct_only_through_rlstructures_paths(program):
    allowed = {renamed(module): set(names) for module, names in PATHS.items()}
    for module, name in rlstruct_imports(PROGRAMS / program):
        assert module in allowed, f"{program} imports {module}, which is not an rlstructures path renamed"
        assert name in allowed[module], f"{program}: rlstructures' {module} had no {name}"
    tree = ast.parse((PROGRAMS / program).read_text())
    imported = {a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names}
    imported |= {n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module}
    assert not [m for m in imported if m.split(".")[0] in ("rlstructures", "rlalgos", "gym")], sorted(imported)


@pytest.fixture
def one_thread():
    """A learner in this process on one thread (the suite shares a small machine; workers set their own)."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


#: tiny sizes shared by every program: 4 envs of 30 steps at most, evaluations in this process
SMALL = {"env_name": "CartPole-v1", "n_envs": 4, "max_episode_steps": 30, "n_evaluation_processes": 0,
         "n_evaluation_envs": 4, "time_limit": 120}
#: the training batcher's worker processes: none (in this process), or two (rlstructures' way)
MODES = [pytest.param(0, id="in_process"), pytest.param(2, id="two_workers", marks=pytest.mark.slow)]


def logged_at(logger, name: str) -> list[int]:
    """The iterations at which ``logger`` (rlstruct.logger's) recorded ``name``."""
    return [i for i, row in enumerate(logger.all_values) if name in row]


def assert_logged_every_iteration(logger, names, iterations):
    for name in names:
        assert logged_at(logger, name) == list(range(iterations)), name
    assert logger.get_scalars("evaluation_reward"), "no evaluation finished"
    assert all(v > 0 for v in logger.get_scalars("evaluation_reward"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n_processes", MODES)
def test_reinforce(n_processes, one_thread):
    torch.manual_seed(0)
    config = {**reinforce.CONFIG, **SMALL, "n_processes": n_processes, "n_iterations": 4}
    algo = reinforce.Reinforce(config, reinforce.create_env, reinforce.create_agent)
    logger = algo.run()
    losses = ["loss/avg_reward", "loss/baseline_loss", "loss/reinforce_loss", "loss/entropy_loss"]
    assert_logged_every_iteration(logger, losses, 4)
    # The loss reached every weight through replay_agent's graph.
    assert all(p.grad is not None and bool(p.grad.abs().sum() > 0) for p in algo.learning_model.parameters())
    assert all(0.0 < h <= float(torch.log(torch.tensor(2.0))) + 1e-6 for h in logger.get_scalars("loss/entropy_loss"))
    # Complete episodes of at most 30 steps: 4 envs x max(n_processes, 1) episodes an iteration.
    n_episodes = 4 * max(n_processes, 1)
    steps = logger.get_scalars("n_interactions")
    assert all(0 < b - a <= 30 * n_episodes for a, b in zip([0.0, *steps], steps))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n_processes", MODES)
def test_reinforce_on_devices_on_the_cpu(n_processes, one_thread):
    torch.manual_seed(0)
    config = {**reinforce_device.CONFIG, **SMALL, "n_processes": n_processes, "n_iterations": 3,
              "learner_device": "cpu", "batcher_device": "cpu", "evaluation_device": "cpu"}
    algo = reinforce_device.ReinforceOnDevices(config, reinforce_device.create_env, reinforce_device.create_agent)
    logger = algo.run()
    assert_logged_every_iteration(logger, ["loss/reinforce_loss", "loss/baseline_loss"], 3)
    assert isinstance(algo.agent, rlstruct.RL_Agent_CheckDevice)


@pytest.mark.cuda
@pytest.mark.timeout(300)
@pytest.mark.parametrize("n_processes", [0, 1])
def test_reinforce_on_devices_with_the_batcher_and_the_learner_on_the_gpu(n_processes, one_thread):
    """The example's layout on one GPU: learner and training batcher on cuda:0, evaluations on the CPU."""
    torch.manual_seed(0)
    config = {**reinforce_device.CONFIG, **SMALL, "n_processes": n_processes, "n_iterations": 3,
              "learner_device": "cuda:0", "batcher_device": "cuda:0", "evaluation_device": "cpu"}
    algo = reinforce_device.ReinforceOnDevices(config, reinforce_device.create_env, reinforce_device.create_agent)
    logger = algo.run()
    assert_logged_every_iteration(logger, ["loss/reinforce_loss", "loss/baseline_loss"], 3)
    assert all(p.device == torch.device("cuda:0") for p in algo.learning_model.parameters())


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n_processes", MODES)
def test_a2c_gae(n_processes, one_thread, tmp_path):
    """rlstructures' A2C as written, its TFLogger and weight_init included: the logger keeps every iteration's
    scalars, and writes them to ``db.csv`` (with the hyper-parameters), TensorBoard (with the extra) and ``done``."""
    torch.manual_seed(0)
    config = {**a2c_gae.CONFIG, **SMALL, "n_processes": n_processes, "a2c_timesteps": 8, "n_windows": 4,
              "logdir": str(tmp_path / "a2c")}
    algo = a2c_gae.A2C(config, a2c_gae.create_train_env, a2c_gae.create_env, a2c_gae.create_agent)
    logger = algo.run()
    assert algo.windows == 4  # each window asserted full length, its state carried from the one before
    for name in ["loss/critic_loss", "loss/a2c_loss", "loss/entropy_loss", "grad_norm"]:
        assert logged_at(logger, name) == [0, 1, 2, 3], name
    assert logger.get_scalars("evaluation_reward") and min(logger.get_scalars("evaluation_reward")) > 0
    rows = list(csv.DictReader(open(tmp_path / "a2c" / "db.csv")))
    assert [int(r["training_iteration"]) for r in rows] == [i for i, row in enumerate(logger.all_values) if row]
    assert [float(r["loss/critic_loss"]) for r in rows if r["loss/critic_loss"]] == logger.get_scalars(
        "loss/critic_loss")
    assert {r["_hp_a2c_timesteps"] for r in rows} == {"8"}
    assert json.loads((tmp_path / "a2c" / "params.json").read_text())["a2c_timesteps"] == 8
    assert (tmp_path / "a2c" / "done").read_text() == "Done\n"
    if importlib.util.find_spec("tensorboard") is not None:
        assert list((tmp_path / "a2c").glob("events.out.tfevents.*"))


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n_processes", MODES)
def test_ppo(n_processes, one_thread, tmp_path):
    torch.manual_seed(0)
    config = {**ppo.CONFIG, **SMALL, "n_processes": n_processes, "ppo_timesteps": 8, "n_windows": 3, "k_epochs": 2,
              "logdir": str(tmp_path)}
    algo = ppo.PPO(config, ppo.create_train_env, ppo.create_env, ppo.create_agent)
    logger = algo.run()
    assert_logged_every_iteration(logger, ["loss/critic_loss", "loss/ppo_loss", "loss/entropy_loss"], 6)
    # Each window's first pass replayed the recorded probabilities (the program asserts it below 1e-5).
    assert logged_at(logger, "replay_difference") == [0, 2, 4]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n_processes", MODES)
def test_dqn(n_processes, one_thread):
    torch.manual_seed(0)
    config = {**dqn.CONFIG, **SMALL, "n_processes": n_processes, "batch_timesteps": 4, "n_iterations": 5,
              "epsilon_min_epoch": 4, "epsilon_greedy_max": 0.9, "epsilon_greedy_min": 0.1}
    algo = dqn.DQN(config, dqn.create_train_env, dqn.create_env, dqn.create_agent)
    logger = algo.run()
    assert_logged_every_iteration(logger, ["epsilon", "q_loss", "stats/replay_buffer_size"], 5)
    # execute(agent_info=...) changed epsilon at every acquisition (the program checks the rows it got back).
    assert logger.get_scalars("epsilon") == pytest.approx([0.9, 0.7, 0.5, 0.3, 0.1])
    per_window = 4 * max(n_processes, 1) * 4
    assert logger.get_scalars("stats/replay_buffer_size") == [per_window * (k + 2) for k in range(5)]


@pytest.mark.timeout(240)
@pytest.mark.parametrize("n_processes", MODES)
def test_diayn_skills_travel_in_agent_info(n_processes, one_thread):
    torch.manual_seed(0)
    config = {**diayn.CONFIG, **SMALL, "n_processes": n_processes, "n_iterations": 3, "n_policies": 3}
    algo = diayn.DIAYN(config, diayn.create_env, diayn.create_agent)
    logger = algo.run()
    # get_loss checked, every iteration, that each trajectory's info carries the skill reset drew for its row.
    assert set(algo.train_agent_info.keys()) == {"stochastic", "idx_policy"}
    assert_logged_every_iteration(logger, ["loss/discriminator_loss", "loss/reinforce_loss"], 3)
    assert all(p.grad is not None for p in algo.discriminator.parameters())
    # The discriminator's reward is a probability among 3 skills, summed over at most 30 steps.
    assert all(0 < r <= 30 for r in logger.get_scalars("evaluation_reward"))
