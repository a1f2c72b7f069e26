"""Data-parallel learners (algos/distributed.py): the world read from torchrun's variables, and gradient averaging
over gloo on loopback, with ranks started by the test, against one process learning on the whole batch."""

from __future__ import annotations

import contextlib
import csv
import functools
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from rlstruct.algos._train.distributed import (
    World,
    all_ranks_stop,
    average_gradients,
    broadcast_parameters,
    effective_batch,
    sum_over_ranks,
    world_from_environment,
)
from rlstruct.algos._train.session import validate
from rlstruct.algos._train.update import UpdateStep, reads
from rlstruct.errors import ConfigError
from tests.helpers import ForkedCommand, rlstruct_in_process

UPDATES = 4
BATCH = 32


def test_plain_run_is_one_rank():
    assert world_from_environment({}) == World(rank=0, size=1, local_rank=0, local_size=1)
    assert sum_over_ranks(World()) is None
    assert average_gradients(nn.Linear(2, 2), World()) == []
    assert effective_batch(4, 16, World()) == 64


def test_every_rank_takes_the_runs_one_seed_per_role_and_the_roles_differ():
    """A training batcher has one env seed and one agent seed, the same on every rank (rank r steps the envs
    r * n_envs, ... of it), apart from the evaluation's per-worker seeds."""
    from rlstruct.algos._train.seeds import (
        AGENT_SEEDS,
        ENV_SEEDS,
        EVALUATION_ENV_SEEDS,
        MAX_WORKERS,
        role_seed,
        worker_seeds,
    )

    assert role_seed(7, ENV_SEEDS) != role_seed(7, AGENT_SEEDS)
    assert role_seed(7, ENV_SEEDS) not in worker_seeds(7, MAX_WORKERS, EVALUATION_ENV_SEEDS)


@pytest.mark.parametrize("env, match", [
    ({"WORLD_SIZE": "two", "RANK": "0"}, "WORLD_SIZE must be a non-negative integer, got 'two'"),
    ({"WORLD_SIZE": "2"}, "RANK must be set"),
    ({"WORLD_SIZE": "2", "RANK": "2"}, r"RANK must be in \[0, 2\), got 2"),
    ({"WORLD_SIZE": "0", "RANK": "0"}, "WORLD_SIZE must be at least 1, got 0"),
])
def test_bad_environment_is_a_config_error(env, match):
    with pytest.raises(ConfigError, match=match):
        world_from_environment(env)


def _data() -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    obs = torch.randn(UPDATES, BATCH, 4, generator=g)
    actions = torch.randint(0, 2, (UPDATES, BATCH), generator=g)
    advantages = torch.randn(UPDATES, BATCH, generator=g)
    return obs, actions, advantages


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Linear(4, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 3))


@reads("obs", "action", "advantage")
def _loss(model, batch) -> tuple[torch.Tensor, dict]:
    """An A2C loss: policy-gradient surrogate plus value loss, means over the batch."""
    out = model(batch["obs"])
    logp = torch.distributions.Categorical(logits=out[:, :2]).log_prob(batch["action"])
    value = out[:, 2]
    return -(logp * batch["advantage"]).mean() + 0.5 * (value - batch["advantage"]).pow(2).mean(), {}


def _train(model, obs, actions, advantages, after_update=None, compiled=False) -> None:
    """UPDATES clipped Adam steps through the learners' UpdateStep; ``compiled``: the loss compiled (aot_eager, no C++
    compiler), its backward through AOTAutograd's graph, as ``--compile-update`` runs it."""
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    step = UpdateStep(functools.partial(_loss, model), optimizer, [("grad_norm", list(model.parameters()))],
                      max_grad_norm=0.5, device="cpu", compile=compiled, backend="aot_eager")
    for k in range(UPDATES):
        step({"obs": obs[k], "action": actions[k], "advantage": advantages[k]})
        if after_update is not None:
            after_update()


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _warm_dynamo() -> None:
    """Dynamo's and AOTAutograd's modules imported and their lazy set-up done, by compiling a function of no use to
    any test (about 3.5 CPU s in a fresh process), so that ranks forked after it compile their update in about 1 s,
    not 4.5."""
    def unrelated(x: torch.Tensor) -> torch.Tensor:
        return (x.sin() * 2).sum()

    x = torch.zeros(3, requires_grad=True)
    torch.compile(unrelated, backend="aot_eager")(x).backward()


def _rank(rank: int, size: int, port: int, out: dict) -> None:
    """Rank ``rank`` of ``size``: the eager update, then the compiled one, each on a model of its own; ``out[rank]``
    gets ``{compiled: (parameters, identical after each update, stop)}``."""
    torch.set_num_threads(1)
    world = World(rank=rank, size=size, local_rank=rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    try:
        results = {}
        for compiled in (False, True):
            model = _model(seed=100 + rank)  # different on purpose: the broadcast makes them equal
            broadcast_parameters(model, world)
            average_gradients(model, world)
            obs, actions, advantages = _data()
            share = slice(rank * BATCH // size, (rank + 1) * BATCH // size)
            identical: list[bool] = []

            def check(model: nn.Module = model, identical: list[bool] = identical) -> None:
                gathered = [torch.empty_like(_flat(model)) for _ in range(size)]
                dist.all_gather(gathered, _flat(model))
                identical.append(all(torch.equal(gathered[0], g) for g in gathered))

            _train(model, obs[:, share], actions[:, share], advantages[:, share], check, compiled)
            stop = all_ranks_stop(rank == size - 1, world)
            results[compiled] = (_flat(model), identical, stop)
        out[rank] = results
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(180)
@pytest.mark.slow
def test_two_ranks_match_one_process_on_the_whole_batch():
    """2 ranks of BATCH/2 rows each, gradients averaged, take the same Adam steps (after clipping) as 1 process of
    BATCH rows; the ranks' models are identical after every update; a stop on one rank stops both. With the loss
    compiled (--compile-update), the averaging still happens in the backward, before the clipping. The eager and the
    compiled update run in the same two ranks, one after the other, each on a model of its own. The ranks are forked
    from this process (torch imported already): a spawned rank's cost was mostly its fresh interpreter's import of
    torch, and the claim is the averaging, not the start; ranks in fresh interpreters are the torchrun tests'. So are
    dynamo's and AOTAutograd's imports and first-use set-up (``_warm_dynamo``), paid once here before the fork rather
    than in each rank: each rank still traces and compiles its own update."""
    _warm_dynamo()
    with mp.Manager() as manager:
        out = manager.dict()
        mp.start_processes(_rank, args=(2, _free_port(), out), nprocs=2, join=True, start_method="fork")
        results = dict(out)
    single = _model(seed=100)
    _train(single, *_data())
    for rank in range(2):
        for compiled in (False, True):
            params, identical, stop = results[rank][compiled]
            assert identical == [True] * UPDATES, (rank, compiled)
            assert stop is True
            torch.testing.assert_close(params, _flat(single), rtol=1e-5, atol=1e-6, msg=f"compiled={compiled}")
    assert not torch.allclose(_flat(single), _flat(_model(seed=100)))  # the updates moved the model


# --------------------------------------------------------------------------- the on-policy loop under torchrun
#: torchrun's ``--log-dir``, in the test's folder (its cwd): without one, torchrun makes a ``torchelastic_*`` folder in
#: the temp folder for each launch and leaves it there
TORCHRUN_LOGS = "torchrun-logs"


def _torchrun(tmp_path, *args: str, timeout: float = 280, env: dict[str, str] | None = None
              ) -> subprocess.CompletedProcess:
    """``torchrun --nproc-per-node 2 --no-python rlstruct ...`` with this interpreter's torchrun and rlstruct, ``env``
    added to this process's environment."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1",
           **(env or {})}
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
           str(_free_port()), "--log-dir", TORCHRUN_LOGS, "--no-python", "rlstruct", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env, cwd=tmp_path)


def _fork_ranks(folder: Path, *args: str, temps: dict[int, str] | None = None) -> list[ForkedCommand]:
    """``rlstruct ARGS`` as 2 ranks forked from this process (``tests.helpers.ForkedCommand``), each given the variables
    torchrun gives a rank (``RANK``, ``LOCAL_RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE``, ``MASTER_ADDR``/``PORT``),
    one torch thread and ``folder`` as its working directory, joining by ``env://`` as ranks a scheduler starts do.
    For a claim of the loop under ranks, where torchrun's three fresh interpreters (its agent and two ranks, each
    importing torch: 7-8 CPU s) prove nothing: torchrun itself is the restart test's and test_multinode_benchmark's.
    A rank with worker processes (``--n-processes``) starts them from a fork server of its own, in its own process
    group, as a fresh interpreter would (``ForkedCommand``). ``temps``: {rank: its temp folder} for a rank whose
    temp folder the test removes (one it kills: its fork server's socket folder would stay)."""
    port = str(_free_port())

    def seam(rank: int):
        def enter() -> None:
            os.chdir(folder)
            os.environ.update({"RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": "2",
                               "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port})
            torch.set_num_threads(1)
        return enter

    return [ForkedCommand(list(args), folder / f"rank{r}", seam=seam(r), temp=(temps or {}).get(r))
            for r in range(2)]


def _forked_ranks(folder: Path, *args: str, timeout: float = 240, meanwhile: Callable[[], None] | None = None
                  ) -> subprocess.CompletedProcess:
    """:func:`_fork_ranks`'s two ranks, waited for: the worse status and both outputs (rank 0's, then rank 1's), as
    torchrun would give them. ``meanwhile()``, when given, runs in this process while the ranks run."""
    ranks = _fork_ranks(folder, *args)
    try:
        if meanwhile is not None:
            meanwhile()
        codes = [rank.wait(timeout) for rank in ranks]
    finally:
        for rank in ranks:
            rank.kill()
    return subprocess.CompletedProcess(["rlstruct", *args], max(codes, key=abs), "".join(r.stdout for r in ranks),
                                       "".join(r.stderr for r in ranks))


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_ppo_two_ranks_train_and_rank_0_alone_reports(launched, capsys):
    """PPO as 2 ranks for 5 iterations (the ppo-target-kl launch, which the equivalence test below shares): one report
    (rank 0's) with world_size 2, every iteration counting both ranks' env steps, rank 0 alone saying what an update
    learns from; one process cannot resume it. That two ranks learn what one process of twice the envs learns is
    test_two_ranks_of_n_envs_learn_what_one_process_of_2n_envs_learns; that they solve CartPole-v1 (475 within 300k
    env steps) is benchmarks/torchrun_learning.py's, whose results are on the data-parallel benchmarks page."""
    run, out = launched("ppo-target-kl")
    summaries = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 1, out.stdout  # one report, rank 0's
    summary = json.loads((run / "summary.json").read_text())
    assert summary == summaries[0] and summary["world_size"] == 2 and summary["env_steps"] == 640
    rows = list(csv.DictReader(open(run / "progress.csv")))
    steps = [int(r["env_steps"]) for r in rows if r["loss/policy"]]
    # each iteration counts both ranks' env steps (--n-envs is per rank)
    config = json.loads((run / "config.json").read_text())
    per_iteration = 2 * config["n_envs"] * config["n_steps"]
    assert out.stderr.count("data-parallel:") == 1 and (  # rank 0 alone says what an update learns from
        f"data-parallel: 2 ranks x {per_iteration // 2:,} env steps of a collection = {per_iteration:,} per update "
        f"(the settings are per rank); gradients averaged over the ranks, lr {config['lr']:g} as given") in out.stderr
    assert steps == [per_iteration * (k + 1) for k in range(5)] and steps[-1] == summary["env_steps"]
    # One process cannot continue what two ranks trained: one line, before anything starts (so the run this test
    # shares is left as it was). The refusal is the command's own, in this process as in a fresh one.
    resumed = rlstruct_in_process(capsys, "train", "ppo", "--resume", str(run))
    assert resumed.returncode == 2 and resumed.stderr.count("\n") == 1, resumed.stderr
    assert "was trained by 2 data-parallel rank(s), got 1 (WORLD_SIZE); resume it with torchrun --nproc-per-node 2" \
        in resumed.stderr


@pytest.mark.slow
@pytest.mark.timeout(300)
def test_dqn_two_ranks_train_with_a_replay_buffer_per_rank(tmp_path):
    """The dqn-cartpole preset as 2 ranks (a buffer each, gradients averaged) for 1,024 env steps (gradient steps from
    the 512th on): one report with world_size 2, both ranks' steps counted in the budget; the ranks' networks (targets
    included) agree at the end (a difference raises). The ranks are forked from this process with torchrun's
    variables (``_forked_ranks``). That they solve CartPole-v1 (475 within the preset's 100k env steps) is
    benchmarks/torchrun_learning.py's, whose results are on the data-parallel benchmarks page."""
    out = _forked_ranks(tmp_path, "train", "dqn", "--env", "CartPole-v1", "--logdir", "run", "--no-progress",
                        "--max-env-steps", "1024", "--learning-starts", "512", "--n-evaluation-envs", "2",
                        "--evaluation-max-steps", "20", "--n-processes", "0")
    assert out.returncode == 0, out.stderr[-3000:]
    summaries = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
    assert len(summaries) == 1 and summaries[0]["world_size"] == 2 and summaries[0]["preset"] == "dqn-cartpole"
    assert summaries[0]["env_steps"] == 1024, summaries
    steps = [int(r["env_steps"]) for r in csv.DictReader(open(tmp_path / "run" / "progress.csv"))]
    config = json.loads((tmp_path / "run" / "config.json").read_text())
    assert steps[0] == 2 * config["n_envs"] * config["rollout_steps"]  # both ranks' steps count in the budget
    rows = [r for r in csv.DictReader(open(tmp_path / "run" / "progress.csv")) if r.get("loss/q")]
    assert rows, "no gradient step was taken"


@pytest.mark.timeout(200)
@pytest.mark.slow
def test_sac_two_ranks_train_alike_and_rank_0_alone_reports(tmp_path):
    """SAC as 2 ranks: the actor, the critics, their targets and the temperature stay identical (checked at the end
    of the run: a difference raises), and one summary.json says world_size 2. 512 env steps, a gradient step every 4
    from the 256th on: their number does not change what is checked. The ranks are forked from this process with
    torchrun's variables (``_forked_ranks``)."""
    out = _forked_ranks(tmp_path, "train", "sac", "--env", "Pendulum-v1", "--logdir", "run", "--no-progress",
                        "--max-env-steps", "512", "--learning-starts", "256", "--gradient-steps-per-env-step", "0.25",
                        "--n-evaluation-envs", "1", "--evaluation-max-steps", "20", "--n-processes", "0")
    assert out.returncode == 0, out.stderr[-3000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["world_size"] == 2 and summary["env_steps"] == 512
    rows = [r for r in csv.DictReader(open(tmp_path / "run" / "progress.csv")) if r.get("loss/critic")]
    assert rows, "no gradient step was taken"


def test_a_non_logging_rank_writes_no_file(tmp_path):
    from rlstruct.algos import describe_env
    from rlstruct.algos._train.log import Run
    from rlstruct.algos.ppo import PPOConfig

    config = PPOConfig(logdir=str(tmp_path / "run"), tensorboard=True, progress=True)
    run = Run("ppo", config, describe_env("CartPole-v1", "torch", None), logger=False)
    run.record(64, {"loss": torch.tensor(1.0)})
    run.flush()
    run.close()
    assert run.history and run.env_steps == 64 and not (tmp_path / "run").exists()


def test_global_sum_and_models_agree_are_identities_for_one_rank():
    from rlstruct.algos._train.distributed import (
        fewest_over_ranks,
        global_sum,
        learner_seed,
        mean_over_ranks,
        models_agree,
    )

    assert global_sum(7, World()) == 7 and models_agree(nn.Linear(2, 2), World()) and fewest_over_ranks(3, World()) == 3
    assert learner_seed(5, World()) == 5 and mean_over_ranks(torch.tensor(2.0), World()) == 2.0
    ranks = [learner_seed(5, World(rank=r, size=4, local_rank=r)) for r in range(4)]
    assert len(set(ranks)) == 4 and all(0 <= s < 2**31 for s in ranks)


# --------------------------------------------------------------------------- 2 ranks of n envs = 1 process of 2n
EQUIVALENT_RUNS = {
    # full-batch A2C; advantage normalisation is per rank (CleanRL's choice), so it is off to compare (the Ray test's
    # run; under torchrun, a2c-normalised runs the same loop with the statistics merged on top)
    "a2c": ["a2c", "--n-steps", "16", "--max-env-steps", "640", "--no-normalize-advantages"],
    # the merged observation and return statistics: every rank's normaliser is one process's on the whole batch
    "a2c-normalised": ["a2c", "--n-steps", "16", "--max-env-steps", "640", "--no-normalize-advantages",
                       "--normalize-observations", "--normalize-rewards"],
    # PPO with one minibatch per epoch, so that every step of every epoch is a full-batch step, and the early stop on
    # the approximate KL: its mean over the ranks is the whole batch's, so both stop alike
    "ppo-target-kl": ["ppo", "--n-steps", "16", "--max-env-steps", "640", "--no-normalize-advantages",
                      "--n-minibatches", "1", "--n-epochs", "8", "--lr", "3e-3", "--target-kl", "0.002"],
}
#: the cases run under torchrun: a2c-normalised's loop is a2c's with the statistics on top, and ppo-target-kl's epochs
#: before its early stop are plain full-batch PPO's, so each proves what a separate plain case would, at one launch
TORCHRUN_CASES = ("a2c-normalised", "ppo-target-kl")


def _common(case: str) -> list[str]:
    algo, *flags = EQUIVALENT_RUNS[case]
    return ["train", algo, "--env", "CartPole-v1", "--preset", "none", "--eval-every", "1000", "--n-evaluation-envs",
            "1", "--evaluation-max-steps", "20", "--no-progress", *flags]


@pytest.fixture(scope="module")
def launched(tmp_path_factory):
    """``launched(case)``: the run folder and the finished run of ``EQUIVALENT_RUNS[case]`` as 2 ranks of 4 envs
    each, stepped in the rank's own process, the ranks forked from this process with torchrun's variables
    (``_forked_ranks``), launched once for the module and read by every test that checks something of it. Read it,
    never write into it."""
    runs: dict[str, tuple[Path, subprocess.CompletedProcess]] = {}

    def launch(case: str) -> tuple[Path, subprocess.CompletedProcess]:
        if case not in runs:
            folder = tmp_path_factory.mktemp(case)
            out = _forked_ranks(folder, *_common(case), "--n-envs", "4", "--n-processes", "0", "--logdir", "ranks")
            assert out.returncode == 0, out.stderr[-3000:]
            runs[case] = folder / "ranks", out
        return runs[case]

    return launch


def _model_of(run_dir: Path) -> dict[str, torch.Tensor]:
    return torch.load(run_dir / "checkpoint.pt", weights_only=True)["model"]


@pytest.mark.slow
@pytest.mark.timeout(300)
@pytest.mark.parametrize("case", TORCHRUN_CASES)
def test_two_ranks_of_n_envs_learn_what_one_process_of_2n_envs_learns(tmp_path, case, capsys, launched):
    """The whole loop, collection included: 2 ranks of 4 envs each (``launched``) end with the parameters that one
    process of 8 envs ends with: the same envs (seeded by their global index) and the same draws on the same rows.
    The one process is this one (the command's entry point). Every env steps in its rank's (its process's) own
    process: that a run is the same over worker processes is tests/algos/test_same_run.py's, and ranks of one worker
    process each against one process of two are test_multinode_benchmark's torchrun test (two launchers, one rank
    each)."""
    ranks, _ = launched(case)
    one = rlstruct_in_process(capsys, *_common(case), "--n-envs", "8", "--n-processes", "0", "--logdir",
                              str(tmp_path / "one"))
    assert one.returncode == 0, one.stderr[-3000:]
    two_ranks, one_process = _model_of(ranks), _model_of(tmp_path / "one")
    assert two_ranks.keys() == one_process.keys()
    for name in one_process:
        torch.testing.assert_close(two_ranks[name], one_process[name], rtol=1e-4, atol=1e-5, msg=name)
    initial = json.loads((tmp_path / "one" / "summary.json").read_text())
    assert initial["env_steps"] == json.loads((ranks / "summary.json").read_text())["env_steps"] == 640
    if case == "a2c-normalised":  # the statistics moved: they count every valid step of both ranks
        assert int(one_process["normalizer.count"]) == int(two_ranks["normalizer.count"]) == 640
    if case == "ppo-target-kl":  # the early stop fired, at the same pass on both sides, and not at every first pass
        epochs = [[float(r["ppo/epochs"]) for r in csv.DictReader(open(d / "progress.csv")) if r["ppo/epochs"]]
                  for d in (tmp_path / "one", ranks)]
        assert epochs[0] == epochs[1] and any(e < 8 for e in epochs[0]) and any(e > 1 for e in epochs[0]), epochs


# --------------------------------------------------------------------------- faults: a rank that dies or hangs
def _descendants(pid: int) -> set[int]:
    """The processes under ``pid`` (its batcher workers), from /proc."""
    found, todo = set(), [pid]
    while todo:
        for task in Path(f"/proc/{todo.pop()}/task").glob("*"):
            try:
                children = {int(c) for c in (task / "children").read_text().split()}
            except OSError:
                continue
            todo.extend(children - found)
            found |= children
    return found


def _alive(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().split()[2] != "Z"
    except OSError:
        return False


def _is_rank(pid: int, rank: int) -> bool:
    """Whether ``pid`` is the ``rlstruct`` process of rank ``rank`` (not one of its helper processes)."""
    try:
        environ, cmdline = (Path(f"/proc/{pid}/{f}").read_bytes() for f in ("environ", "cmdline"))
    except OSError:
        return False
    return f"RANK={rank}\0".encode() in environ and b"rlstruct" in cmdline and b"multiprocessing" not in cmdline


#: a PPO run without evaluations; each test sets its budget and sizes
LONG_RUN = ["train", "ppo", "--env", "CartPole-v1", "--preset", "none", "--no-stop-at-reward-threshold",
            "--eval-every", "1000", "--n-evaluation-envs", "1", "--no-progress", "--no-tensorboard"]


@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads the process tree from /proc (Linux)")
@pytest.mark.timeout(120)
@pytest.mark.parametrize("fault", ["dies", "hangs"])
@pytest.mark.slow
def test_a_rank_that_dies_or_hangs_ends_the_others_with_a_typed_error(tmp_path, fault):
    """Two ranks launched as a scheduler would (RANK, WORLD_SIZE, MASTER_ADDR/PORT; no torchrun agent to kill the
    rest): once training runs, rank 1 is SIGKILLed (dies) or SIGSTOPped (hangs). Rank 0 ends with status 1 and one
    line naming RankLostError's situation, within the timeout (5 s here) and not in a hang. Small iterations (4 envs x
    16 steps a rank): what the test pays for is the ranks' start. The timeout stays 5 s, and the ranks alike: it also
    bounds the rendezvous, so that ranks that start unevenly on a loaded machine would time out there instead. The
    ranks are forked from this process (``_fork_ranks``: each in a process group of its own, as a fresh interpreter
    would be, a fresh interpreter's import of torch proving nothing here). ``dies``: a worker process each, from each
    rank's own fork server, and rank 0's batcher workers are gone after it. ``hangs``: the envs stepped in process
    (no worker to start): the claim is the timeout of a collective, the workers' end is the other case's."""
    flags = [*LONG_RUN, "--max-env-steps", "5000000", "--n-envs", "4", "--n-steps", "16", "--batcher-timeout", "5"]
    # Rank 1's temp folder is this test's (short: its fork server's socket lives there): killed, it removes nothing.
    temp = tempfile.mkdtemp(prefix="r")
    ranks = _fork_ranks(tmp_path, *flags, "--n-processes", "1" if fault == "dies" else "0", "--logdir", "run0",
                        temps={1: temp})
    try:
        progress = tmp_path / "run0" / "progress.csv"
        deadline = time.monotonic() + 90
        while not (progress.exists() and progress.read_text().count("\n") >= 3):  # the header and two iterations
            assert time.monotonic() < deadline and ranks[0].poll() is None, ranks[0].stderr[-2000:]
            time.sleep(0.2)
        workers = _descendants(ranks[0].pid)
        assert workers or fault == "hangs", "rank 0 runs its batcher's worker process"
        os.kill(ranks[1].pid, signal.SIGKILL if fault == "dies" else signal.SIGSTOP)
        hit = time.monotonic()
        ranks[0].wait(60)
        waited = time.monotonic() - hit
        err = ranks[0].stderr
    finally:
        for p in ranks:
            p.kill()
        # rank 1's fork server and worker, left in its group by the SIGKILL of the rank alone, and its temp folder
        with contextlib.suppress(ProcessLookupError):
            os.killpg(ranks[1].pid, signal.SIGKILL)
        shutil.rmtree(temp, ignore_errors=True)
    assert ranks[0].returncode == 1, err[-2000:]
    last = err.strip().splitlines()[-1]
    assert last.startswith("rlstruct train ppo: error: rank 0 of 2: ") and "another rank of the run died, left or " \
        "did not answer within the timeout" in last and "torchrun --max-restarts N --logdir DIR" in last, err[-2000:]
    assert "Traceback" not in err
    assert waited < (20 if fault == "dies" else 35), waited  # a connection reset at once; a hang at the 5 s timeout
    within = time.monotonic() + 1  # at most a second for the workers' own exits
    while [w for w in workers if _alive(w)] and time.monotonic() < within:
        time.sleep(0.05)
    assert not [w for w in workers if _alive(w)], "rank 0's workers outlived it"


@pytest.mark.long(reason="two torchrun launches of two ranks each, every rank importing torch: 20-25 CPU s, up to 35 "
                         "on a busy machine")
@pytest.mark.skipif(not Path("/proc/self/task").exists(), reason="reads the process tree from /proc (Linux)")
@pytest.mark.timeout(300)
def test_torchrun_max_restarts_resumes_the_group_from_the_last_checkpoint(tmp_path):
    """torchrun --max-restarts 1: rank 1 is killed once rank 0 wrote a periodic checkpoint; torchrun restarts both
    ranks, which resume from --logdir's checkpoint (no --resume given) and finish the budget: one run, one
    summary, the rows of the first attempt up to its checkpoint kept. 20 small iterations (4 envs x 32 steps a rank),
    a checkpoint every 4: the kill comes after the first checkpoint, with 16 iterations left to resume. Rank 1 is
    found before the checkpoint is written, so that the kill follows it within a 0.05 s poll, a small part of what
    those 16 iterations take."""
    bin_dir = Path(sys.executable).parent
    env = {**os.environ, "PATH": f"{bin_dir}{os.pathsep}{os.environ.get('PATH', '')}", "OMP_NUM_THREADS": "1"}
    budget = 20 * 2 * 4 * 32  # 20 iterations of 2 ranks x 4 envs x 32 steps
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
           "--master-port", str(_free_port()), "--log-dir", TORCHRUN_LOGS, "--no-python", "rlstruct", *LONG_RUN,
           "--max-env-steps", str(budget), "--n-envs", "4", "--n-steps", "32", "--checkpoint-every", "4",
           "--logdir", "run"]
    launcher = subprocess.Popen(cmd, env=env, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                text=True)
    try:
        checkpoint = tmp_path / "run" / "checkpoint.pt"
        deadline = time.monotonic() + 150
        rank_1: list[int] = []
        while not rank_1:
            assert time.monotonic() < deadline and launcher.poll() is None, launcher.stderr.read()[-3000:]
            assert not checkpoint.exists(), "rank 1 was not found before the first checkpoint"
            rank_1 = [p for p in _descendants(launcher.pid) if _is_rank(p, 1)]
            time.sleep(0.05)
        assert len(rank_1) == 1, rank_1
        while not checkpoint.exists():
            assert time.monotonic() < deadline and launcher.poll() is None, launcher.stderr.read()[-3000:]
            time.sleep(0.05)
        os.kill(rank_1[0], signal.SIGKILL)
        out, err = launcher.communicate(timeout=240)
    finally:
        launcher.kill()
    assert launcher.returncode == 0, err[-3000:]
    assert "torchrun restarted the ranks (restart 1): resuming run" in err
    summaries = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    assert len(summaries) == 1 and summaries[0]["world_size"] == 2 and summaries[0]["env_steps"] == budget
    steps = [int(r["env_steps"]) for r in csv.DictReader(open(tmp_path / "run" / "progress.csv")) if r["loss/policy"]]
    assert steps == sorted(steps) and len(set(steps)) == len(steps) == 20, steps  # no iteration lost or twice


# --------------------------------------------------------------------------- Ray collectors feeding the learners
@pytest.mark.ray
@pytest.mark.timeout(300)
def test_ray_actors_feed_a_process_and_the_ranks_as_worker_processes_do(tmp_path, capsys, ray_head):
    """The training batcher as Ray actors on a running cluster (the Ray tests' shared one, tests/ray_cluster.py: a
    `ray start --head` node, joined by its address and token): --ray-actors 2 --ray-address ADDRESS, and 2
    data-parallel ranks of one actor each on it, end A2C with the parameters one process ends with: the actors step
    the same envs, seeded by their global index, rows in the same order. Over 4 updates (256 env steps), each one's
    weights sent to every actor before the next collection. The one process and the --ray-actors 2 run run in this
    process (the command's entry point); the ranks are forked from it with torchrun's variables (``_forked_ranks``;
    torchrun itself is the restart test's and test_multinode_benchmark's). The one process steps its envs in
    process: that worker processes change nothing is tests/algos/test_same_run.py's, and two worker processes
    against Ray actors is test_multinode_benchmark's Ray test. That a run without --ray-address starts a local
    cluster of its own and ends it is
    test_a_run_starts_a_local_ray_cluster_without_an_address_and_ends_what_it_started's (Ray's local cluster running
    RayBatcher's actors is tutorial 08's)."""
    algo, *flags = EQUIVALENT_RUNS["a2c"]
    flags[flags.index("--max-env-steps") + 1] = "256"
    common = ["train", algo, "--env", "CartPole-v1", "--preset", "none", "--n-envs", "4", "--eval-every", "1000",
              "--n-evaluation-envs", "1", "--evaluation-max-steps", "20", "--no-progress", *flags]
    # The ranks first, forked while this process runs no Ray driver (a fork of one would share its connection).
    # --n-envs is per rank (the run's total over its worker processes or actors): 2 ranks of 2 envs each.
    assert "ray" not in sys.modules or not sys.modules["ray"].is_initialized(), "a Ray driver runs in this process"
    per_rank = [("2" if previous == "--n-envs" else a) for previous, a in zip(["", *common], common)]
    outputs = {}

    def run(name: str, *where: str) -> None:
        outputs[name] = rlstruct_in_process(capsys, *common, *where, "--logdir", str(tmp_path / name))

    # The one process (no Ray) runs while the ranks wait for their actors; the --ray-actors 2 run after them, as the
    # cluster's 2 CPUs hold the ranks' 2 actors or its own.
    outputs["ranks"] = _forked_ranks(tmp_path, *per_rank, "--ray-actors", "1", "--ray-address", ray_head.address,
                                     "--logdir", "ranks", meanwhile=lambda: run("processes", "--n-processes", "0"))
    run("actors", "--ray-actors", "2", "--ray-address", ray_head.address)
    for out in outputs.values():
        assert out.returncode == 0, out.stderr[-3000:]
    processes = _model_of(tmp_path / "processes")
    for name in ("actors", "ranks"):
        other = _model_of(tmp_path / name)
        for key in processes:
            torch.testing.assert_close(other[key], processes[key], rtol=1e-4, atol=1e-5, msg=f"{name}: {key}")


def test_a_run_starts_a_local_ray_cluster_without_an_address_and_ends_what_it_started(monkeypatch):
    """A run's Ray session (``--ray-actors N``): without ``--ray-address``, a local cluster on the loopback interface,
    Ray imported only after RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 is set (unset, it would listen on every interface),
    shut down when the run ends, even when it fails; with one, a connection to it, shut down too; in a process that
    runs Ray already, that session, left running. Ray is a stand-in here: that such a ``ray.init`` starts a local
    cluster whose actors RayBatcher runs is tutorial 08's (its ``ray.init`` is this one's with ``num_cpus=2``), and a
    run's actors on a cluster are the Ray test's above; a local cluster of a run's own, started here, would be
    seconds of wall time that prove Ray's start, not rlstruct's."""
    from rlstruct.algos._train.session import ray_session

    calls: list[tuple] = []
    running = [False]

    def init(**kwargs):
        calls.append(("init", os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"), kwargs))
        running[0] = True

    def shutdown():
        calls.append(("shutdown",))
        running[0] = False

    fake = type(sys)("ray")
    fake.init, fake.shutdown, fake.is_initialized = init, shutdown, lambda: running[0]
    monkeypatch.setitem(sys.modules, "ray", fake)
    monkeypatch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "")
    monkeypatch.delenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER")  # restored, absent or not, after the test
    with pytest.raises(RuntimeError, match="the run failed"), ray_session(None):
        assert running[0]
        raise RuntimeError("the run failed")
    local = {"include_dashboard": False, "_node_ip_address": "127.0.0.1", "log_to_driver": False,
             "configure_logging": False}
    assert calls == [("init", "0", local), ("shutdown",)]
    calls.clear()
    with ray_session("127.0.0.1:6379"):
        assert running[0]
    assert calls == [("init", "0", {"address": "127.0.0.1:6379", "log_to_driver": False, "configure_logging": False}),
                     ("shutdown",)]
    calls.clear()
    running[0] = True
    with ray_session("127.0.0.1:6379"):
        pass
    assert calls == [] and running[0]


def test_ray_address_without_actors_is_refused():
    from rlstruct.algos.a2c import ALGORITHM, A2CConfig

    with pytest.raises(ConfigError, match=r"ray_address='auto' names a Ray cluster .* got ray_actors=0; pass "
                                          r"--ray-actors N too"):
        validate(ALGORITHM, A2CConfig(ray_address="auto"))
