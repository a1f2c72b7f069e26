"""RayBatcher: the same trajectories as RL_Batcher, versioned weights, placement, faults, clean close.

The tests that need Ray join the cluster that the Ray tests in a row share (tests/ray_cluster.py: one node on
the loopback interface, 2 logical CPUs, token authentication) through one driver, this process, for the module, and
are skipped when Ray is not installed; the argument checks run without it.
"""

from __future__ import annotations

import os
import sys
import time

import pytest
import torch

from rlstruct import DictTensor, TemporalDictTensor, Trajectories
from rlstruct._determinism import worker_environment
from rlstruct.algos import create_env
from rlstruct.algos.policies import create_policy_agent
from rlstruct.batchers import RL_Batcher, WorkerPlacement, restart_seed
from rlstruct.batchers.ray_batcher import RayBatcher
from rlstruct.envs import CartPole
from rlstruct.errors import (
    ActionRangeError,
    BatcherStateError,
    BatcherWorkerError,
    BatchSizeError,
    ConfigError,
    DeviceMismatchError,
    DeviceUnavailableError,
    MissingDependencyError,
)
from tests.fakes import ConstantAgent, CounterAgent, CountingEnv, FaultEnv, pid_alive
from tests.helpers import AUTORESET, EPISODIC, assert_refused_while_pending, assert_same, get_when_ready, wall_limit
from tests.ray_cluster import IMPORT_ENV

pytestmark = [pytest.mark.timeout(120), pytest.mark.ray]


def import_ray():
    """Ray, imported for this machine only (no usage report, loopback addresses) and with the shared cluster's token,
    whether or not a cluster runs yet: Ray reads them once, at import (tests/ray_cluster.py's ``IMPORT_ENV``)."""
    # RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER is read once when Ray is imported; unset, a local cluster listens on
    # every interface whatever _node_ip_address says.
    os.environ.update(IMPORT_ENV)
    ray = pytest.importorskip("ray", reason="the ray extra is not installed: pip install 'rlstruct[ray]'")
    from ray._private import ray_constants

    if ray_constants.ENABLE_RAY_CLUSTER:
        pytest.fail("Ray was imported before RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0 was set: it would listen on "
                    "every interface; run the Ray tests in a process that has not imported Ray yet")
    return ray


@pytest.fixture(scope="module")
def ray_cluster(ray_head):
    """Ray, this process a driver of the shared cluster (``ray_head``) for the module; its actors end with it."""
    ray = import_ray()
    ray.init(address=ray_head.address, log_to_driver=False, configure_logging=False)
    try:
        assert [n["NodeManagerAddress"] for n in ray.nodes()] == ["127.0.0.1"]
        yield ray
    finally:
        ray.shutdown()


def run(batcher, n_executes, updates=(), agent_info=None, env_info=None):
    """reset, then execute/get up to ``n_executes`` times, updating weights before execute i in ``updates``."""
    out = []
    batcher.reset(agent_info=agent_info, env_info=env_info)
    for i in range(n_executes):
        if i in updates:
            batcher.update({"scale": torch.tensor([float(i + 2)])})
        batcher.execute()
        traj, n = batcher.get()
        out.append((traj, n))
        if n == 0:
            break
    return out


def assert_same_runs(a, b):
    assert len(a) == len(b)
    for (ta, na), (tb, nb) in zip(a, b):
        assert na == nb
        assert_same(ta, tb)


# --------------------------------------------------------------------------- without a cluster
def test_missing_ray_is_named(monkeypatch):
    monkeypatch.setitem(sys.modules, "ray", None)
    with pytest.raises(MissingDependencyError, match=r"pip install 'rlstruct\[ray\]'"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0])


def test_ray_not_initialised_is_named(monkeypatch):
    ray = import_ray()
    monkeypatch.setattr(ray, "is_initialized", lambda: False)  # whatever ran before
    with pytest.raises(BatcherStateError, match=r"needs a running Ray.*ray.init\(address="):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0])


def test_bad_constructor_arguments():
    with pytest.raises(ValueError, match="n_actors must be an int >= 1, got 0"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [], n_actors=0)
    with pytest.raises(ConfigError, match=r"one seed per worker of every actor.*= 4, got 2"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 2, [0, 1], n_actors=2)
    with pytest.raises(ConfigError, match="agent_seeds must hold one seed per worker of every actor"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0, 1], agent_seeds=[0], n_actors=2)
    with pytest.raises(ValueError, match="num_cpus must be > 0"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0], num_cpus=0)
    with pytest.raises(ValueError, match="num_gpus must be >= 0"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0], num_gpus=-1)
    if torch.cuda.device_count() < 8:
        with pytest.raises(DeviceUnavailableError, match="device='cuda:7' does not exist on this machine"):
            RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0], device="cuda:7")
    with pytest.raises(ValueError, match=r"placement_strategy must be one of \['SPREAD', 'PACK'"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0], placement_strategy="spread")
    with pytest.raises(ValueError, match="max_restarts must be an int >= -1"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0], max_restarts=-2)
    with pytest.raises(ValueError, match="one WorkerPlacement per actor"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0, 1], n_actors=2,
                   actor_placements=[WorkerPlacement()])
    if hasattr(os, "sched_setaffinity"):
        with pytest.raises(ValueError, match=r"actor_placements\[0\] pins cores \(cpus="):
            RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0],
                       actor_placements=[WorkerPlacement(cpus=(min(os.sched_getaffinity(0)),))])
    with pytest.raises(ValueError, match="actor 0 runs on cuda:0 but num_gpus=0, so Ray gives it no GPU"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0], actor_device="cuda:0", num_gpus=0)
    with pytest.raises(ValueError, match=r"needs every actor on a CUDA device, but actor 0 runs on cpu"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0], cuda_graph=True)
    with pytest.raises(DeviceMismatchError, match="agent_info must be on the CPU"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, EPISODIC, 0, [0],
                   agent_info=DictTensor({"x": torch.zeros(1, device="meta")}))


def test_rebuild_pads_time_and_skips_actors_without_rows():
    from rlstruct.batchers._wire import rebuild, trajectories_to_wire

    def traj(n, T, fill):
        return Trajectories(DictTensor({"agent_info/x": torch.full((n,), fill)}),
                            TemporalDictTensor({"observation/o": torch.full((n, T, 2), fill).to(torch.bfloat16)},
                                               torch.full((n,), T)))

    a, b = traj(2, 3, 1.0), traj(1, 1, 2.0)
    out = rebuild([trajectories_to_wire(a), None, trajectories_to_wire(b)], torch.device("cpu"))
    ref = Trajectories.cat([a, b])
    assert_same(out, ref)
    assert out.trajectories["observation/o"].dtype == torch.bfloat16
    assert out.trajectories["observation/o"][2, 1:].eq(0).all()  # padding beyond lengths is zero
    out.trajectories["observation/o"].add_(1)  # the result is the caller's own memory


# --------------------------------------------------------------------------- equivalence
SEEDS, AGENT_SEEDS = [3, 11], [103, 111]
N = 2 * EPISODIC["n_envs"]
AI = DictTensor({"bonus": torch.arange(N, dtype=torch.float32)})
EI = DictTensor({"level": torch.arange(N)})


@pytest.fixture(scope="module")
def shared(ray_cluster):
    """Two actors on the episodic CountingEnv, restarts allowed; every test leaves it usable.

    Its actors take half a (logical) CPU each, so that the other tests' actors fit beside them.
    """
    with RayBatcher(3, CounterAgent, {}, CountingEnv, EPISODIC, 0, SEEDS, n_actors=2, agent_info=AI.slice(0, 1),
                    env_info=EI.slice(0, 1), agent_seeds=AGENT_SEEDS, max_restarts=1, num_cpus=0.5) as b:
        yield b


def test_two_actors_equal_rl_batcher(shared):
    # Actor k's rows are what RL_Batcher gives for worker k's seeds (RL_Batcher's own tests prove that its
    # in-process and worker-process modes agree, so in-process references keep this test fast).
    assert shared.n_elems() == N
    got = run(shared, 5, updates=(1, 2), agent_info=AI, env_info=EI)
    per_actor = []
    for k in range(2):
        with RL_Batcher(3, CounterAgent, {}, CountingEnv, EPISODIC, 0, SEEDS[k:k + 1], agent_info=AI.slice(0, 1),
                        env_info=EI.slice(0, 1), agent_seeds=AGENT_SEEDS[k:k + 1]) as b:
            per_actor.append(run(b, 5, updates=(1, 2), agent_info=AI.slice(3 * k, 3 * k + 3),
                                 env_info=EI.slice(3 * k, 3 * k + 3)))
    refs = [(Trajectories.cat([a[0], b[0]]), a[1] + b[1]) for a, b in zip(*per_actor)]
    assert [n for _, n in got] == [4, 2, 0]
    assert_same_runs(got, refs)
    # The weights of update(i) reached every actor before execute i.
    traj = got[2][0].trajectories
    m = traj.mask().bool()
    assert torch.equal(traj["action/scaled"][m], 4 * traj["action/count"][m].float())
    reports = shared.worker_reports()
    assert len({r["pid"] for r in reports}) == 2 and all(r["node_ip"] == "127.0.0.1" for r in reports)
    assert all(r["environ"]["CUDA_VISIBLE_DEVICES"] == "" and not r["cuda_initialized"] for r in reports)


def test_contract_timings_and_misuse(shared):
    b = shared
    with pytest.raises(BatchSizeError, match="one row per env, the sum of every actor's envs = 6, got 2"):
        b.reset(agent_info=DictTensor({"bonus": torch.zeros(2)}))
    b.reset()
    b.reset_timings()
    b.execute()
    assert_refused_while_pending(b)
    traj, n = get_when_ready(b)
    assert n == 4 and traj.n_elems() == 6 and traj.trajectories.lengths.tolist() == [2, 3, 3, 2, 3, 3]
    assert traj.trajectories["observation/frame"][:, 0, 0].tolist() == [3000, 3001, 3002, 11000, 11001, 11002]
    assert set(traj.info.keys()) == {"agent_info/bonus", "env_info/level", "agent_state/count"}
    with pytest.raises(ValueError, match="keys, row shapes and dtypes"):
        b.execute(agent_info=DictTensor({"other": torch.zeros(6)}))
    with pytest.raises(DeviceMismatchError, match="CPU state dict"):
        b.update({"scale": torch.zeros(1, device="meta")})
    b.execute(agent_info=DictTensor({"bonus": -torch.ones(6)}))
    traj, n = b.get()
    assert (traj.trajectories["action/bonus"][:, 0] == -1).all()
    t = b.timings()
    assert t["env_steps"] == (2 + 3 + 3 + 1 + 3) * 2 and t["steps"] == 4 * 3
    assert all(t[k] >= 0 for k in ("agent_forward", "env_step", "buffer_write", "copy", "wait", "gather"))
    assert t["wait"] > 0
    b.reset_timings()
    assert b.timings()["env_steps"] == 0
    while n:
        b.execute()
        _, n = b.get()
    with pytest.raises(BatcherStateError, match="every env has finished"):
        b.execute()


def test_restarted_actor_is_restored_with_the_latest_weights(shared, ray_cluster):
    b = shared
    b.reset()
    b.update({"scale": torch.tensor([5.0])})
    b.execute()
    b.get()
    old = b.worker_reports()[1]["pid"]
    ray_cluster.kill(b.actors[1], no_restart=False)  # Ray restarts it: a fresh RL_Batcher, weights version 0
    assert _wait_dead([old])
    b.execute()
    traj, n = b.get()  # actor 1 refuses the stale acquisition, is restored, then collects
    report = b.worker_reports()[1]
    assert report["restarts"] == 1 and report["pid"] != old
    (r,) = b.restarts[-1:]
    assert (r.worker_id, r.during, r.seed) == (1, "get", restart_seed(SEEDS[1], 1)) and b.n_restarts >= 1
    # Its RL_Batcher was rebuilt with the restart's seed: its fresh episodes are not its first ones replayed.
    frames = traj.trajectories["observation/frame"][2:, 0, 0]
    assert torch.equal(frames, r.seed * 1000.0 + torch.arange(3, dtype=torch.float32))
    tr = traj.trajectories
    m = tr.mask().bool()
    assert torch.equal(tr["action/scaled"][m], 5 * tr["action/count"][m].float())
    # Actor 0 carried on with its 2 running envs; actor 1 started 3 fresh episodes.
    assert tr["observation/frame"][:, 0, 1].tolist() == [3, 3, 0, 0, 0]
    assert n == 3


def test_an_unclosed_ray_batcher_is_closed_when_collected(ray_cluster):
    import gc

    b = RayBatcher(3, ConstantAgent, {}, CountingEnv, AUTORESET, 0, [0], num_cpus=0.5)
    actor = b.actors[0]
    b.reset()
    b.execute()  # an acquisition under way
    with pytest.warns(ResourceWarning, match=r"unclosed RayBatcher with 1 actors created at .*test_ray_batcher"):
        del b
        gc.collect()
    _assert_killed(ray_cluster, actor)


@pytest.mark.timeout(180)
def test_an_actors_failed_worker_process_is_replaced_within_the_actor(ray_cluster):
    env = {"n_envs": 2, "autoreset": True, "episode_lengths": (100,), "fault": "exit", "at_step": 3}
    with RayBatcher(2, ConstantAgent, {}, FaultEnv, env, 1, [0], num_cpus=0.5, restart_workers=1) as b:
        b.reset()
        b.execute()
        b.get()
        b.execute()
        second, _ = b.get()  # its worker exits at its 3rd step: replaced, its rows collected again
        assert b.n_restarts == 0  # the actor itself did not die
        frame = second.trajectories["observation/frame"]
        # Fresh episodes of the new worker (of another seed), not the dead worker's steps 2 and 3.
        assert torch.equal(frame[:, :, 1], torch.tensor([[0.0, 1.0]] * 2)) and (frame[:, :, 0] >= 1000).all()
        assert second.trajectories.lengths.tolist() == [2, 2]


def test_ray_batcher_is_a_drop_in_for_rl_batcher(ray_cluster):
    """The very arguments of an RL_Batcher, positional and keyword: swapping the class name is the whole change.

    On the episodic env: that an actor of auto-reset envs collects what RL_Batcher collects is
    test_an_actor_hosting_worker_processes_equals_rl_batcher_and_reports_their_errors's and
    test_two_actors_with_one_seed_collect_what_one_rl_batcher_of_all_the_envs_collects's (an actor is a process
    that imports torch: a case of its own would start one more)."""
    args = (3, CounterAgent, {}, CountingEnv, EPISODIC, 0, [4])
    kwargs = {"agent_info": AI.slice(0, 3), "env_info": EI.slice(0, 3), "agent_seeds": [9], "device": "cpu",
              "timeout": 60.0, "sync_timings": False, "zero_copy": False}
    runs = []
    for cls in (RL_Batcher, RayBatcher):
        with cls(*args, **kwargs) as b:
            runs.append(run(b, 3, updates=(1,)))
    assert_same_runs(*runs)


def test_an_actor_hosting_worker_processes_equals_rl_batcher_and_reports_their_errors(ray_cluster, shared):
    """One actor (one node) whose RL_Batcher runs 2 shared-memory worker processes, started as a ``--deterministic
    --ray-actors N`` run starts its actors (their ``runtime_env``): the actor and its worker processes turn
    deterministic mode on before building anything, and collect what RL_Batcher collects; an actor without it (the
    shared batcher's) does not."""
    with RayBatcher(4, CounterAgent, {}, CountingEnv, AUTORESET, 2, [1, 2], agent_seeds=[5, 6],
                    num_cpus=1, runtime_env={"env_vars": worker_environment()}) as rb:
        got = run(rb, 2, updates=(1,))
        report = rb.worker_reports()[0]
        assert report["deterministic"] is True
        assert [w["deterministic"] for w in report["workers"]] == [True, True]
        assert [w["environ"]["CUBLAS_WORKSPACE_CONFIG"] for w in report["workers"]] == [":4096:8"] * 2
        assert [r["deterministic"] for r in shared.worker_reports()] == [False, False]
        # update() returns at once; an agent.update that raises in a worker process surfaces at the next get().
        rb.update({"no_scale_key": torch.zeros(1)})
        rb.execute()
        applying = r"actor 0 raised .* applying the weights of update\(\) \(version 2\) failed: worker [01] raised Key"
        with pytest.raises(BatcherWorkerError, match=applying):
            rb.get()
        with pytest.raises(BatcherStateError, match="after an actor failed"):
            rb.execute()
    per_worker = []
    for k in range(2):
        with RL_Batcher(4, CounterAgent, {}, CountingEnv, AUTORESET, 0, [1 + k], agent_seeds=[5 + k]) as b:
            per_worker.append(run(b, 2, updates=(1,)))
    assert_same_runs(got, [(Trajectories.cat([a[0], b[0]]), a[1] + b[1]) for a, b in zip(*per_worker)])
    assert len(report["workers"]) == 2 and all(w["pid"] != report["pid"] for w in report["workers"])


def test_two_actors_with_one_seed_collect_what_one_rl_batcher_of_all_the_envs_collects(ray_cluster):
    """One seed: actor k steps the envs after actor k - 1's, and the algorithms' agents key their draws by env."""
    from tests.batchers.test_same_run import STOCHASTIC, collect, policy_args

    agent_args, weights = policy_args("torch")
    env_args = {"name": "CartPole-v1", "n_envs": 2, "autoreset": True}
    with RayBatcher(12, create_policy_agent, agent_args, create_env, env_args, 0, 7, n_actors=2, agent_seeds=11,
                    agent_info=STOCHASTIC, num_cpus=0.5) as rb:
        rb.update(weights)
        got = [t for t, _ in run(rb, 2)]
    for a, b in zip(collect(0, "torch"), got):
        assert_same(a, b)


def test_unplaceable_actors_are_reported_not_waited_for(ray_cluster):
    # Half a second: two one-GPU bundles never place on a node of fewer GPUs; the test waits, it does not compute.
    with pytest.raises(BatcherWorkerError, match=r"could not be placed within 0.5 s.*lower num_cpus/num_gpus"):
        RayBatcher(3, ConstantAgent, {}, CountingEnv, AUTORESET, 0, [0, 1], n_actors=2, num_gpus=1,
                   placement_strategy="SPREAD", start_timeout=0.5)


# --------------------------------------------------------------------------- placement and faults
def _assert_killed(ray, actor, seconds=30.0) -> None:
    """That a call to ``actor`` fails with ``RayActorError`` within ``seconds`` (scaled). ``ray.kill`` returns before
    the actor is dead: it asks Ray's control store, while a call goes straight to the actor's process, so a call sent
    right after the kill can still be answered (once in a suite run: "DID NOT RAISE")."""
    deadline = time.monotonic() + wall_limit(seconds)
    while True:
        try:
            ray.get(actor.info.remote(), timeout=wall_limit(seconds))
        except ray.exceptions.RayActorError:
            return
        assert time.monotonic() < deadline, f"the killed actor still answers {seconds:.0f} s after its kill"
        time.sleep(0.1)


def _wait_dead(pids, seconds=20.0):
    deadline = time.monotonic() + seconds
    while any(pid_alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    return not any(pid_alive(p) for p in pids)


def test_placed_actors_get_their_environment_and_a_killed_one_is_reported(ray_cluster):
    ray = ray_cluster
    placements = [WorkerPlacement("cpu", env={"RLSTRUCT_TEST_TAG": "a"}),
                  WorkerPlacement("cpu", env={"RLSTRUCT_TEST_TAG": "b"}, num_threads=1)]
    # Both actors' envs hang at their 3rd step (the second acquisition), so actor 1 is busy when it is killed.
    b = RayBatcher(2, ConstantAgent, {}, CountingEnv, {**AUTORESET, "hang_at_step": 3}, 0, [0, 1], n_actors=2,
                   num_cpus=0.5, placement_strategy="PACK", actor_placements=placements, timeout=60)
    reports = b.worker_reports()
    assert [r["environ"]["RLSTRUCT_TEST_TAG"] for r in reports] == ["a", "b"]
    assert all(r["environ"]["CUDA_VISIBLE_DEVICES"] == "" for r in reports)
    assert "RLSTRUCT_TEST_TAG" not in os.environ
    pids = [r["pid"] for r in reports]
    b.reset()
    b.execute()
    assert b.get()[1] == 6
    b.execute()
    ray.kill(b.actors[1])  # while actor 0 hangs: the death is reported at once all the same
    t0 = time.monotonic()
    with pytest.raises(BatcherWorkerError, match="actor 1 died during execute") as e:
        b.get()
    assert e.value.worker_id == 1 and time.monotonic() - t0 < wall_limit(10)
    with pytest.raises(BatcherStateError, match="after an actor failed"):
        b.execute()
    actors = b.actors
    b.close()
    assert _wait_dead(pids)
    _assert_killed(ray, actors[0])


def test_hung_actor_times_out(ray_cluster):
    b = RayBatcher(3, ConstantAgent, {}, CountingEnv, {**AUTORESET, "hang_at_step": 1}, 0, [0], num_cpus=0.5,
                   timeout=1)
    pids = [r["pid"] for r in b.worker_reports()]
    b.reset()
    b.execute()
    with pytest.raises(BatcherWorkerError, match="actor 0 did not answer within 1 s during execute"):
        b.get()
    b.close()
    assert _wait_dead(pids)


def test_an_actor_whose_batcher_cannot_be_built_reports_the_constructors_error(ray_cluster):
    # The agent factory's TypeError reaches the driver, with the actor's traceback (Ray logs it only on the node).
    with pytest.raises(BatcherWorkerError,
                       match=r"actor 0 failed to start: .*TypeError: ConstantAgent\(\) takes no arguments") as e:
        RayBatcher(3, ConstantAgent, {"no_such_argument": 1}, CountingEnv, AUTORESET, 0, [0], num_cpus=0.5)
    assert "create_agent(**agent_args)" in e.value.remote_traceback  # where it was raised, in the actor


def test_the_documented_example_runs_on_a_local_cluster(ray_cluster):
    """The scaling page's RayBatcher block as written, but for the cluster (the test's) and sizes (this machine's)."""
    import re
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "scaling.md").read_text()
    block = next(b for b in re.findall(r"```python\n(.*?)```", page, flags=re.S) if "RayBatcher(" in b)
    for old, new in [('ray.init(address="auto")', "pass"), ('"n_envs": 512', '"n_envs": 4'),
                     ("n_actors=4, seeds=list(range(4 * 8)), n_processes=8", "n_actors=1, seeds=[0], n_processes=0"),
                     ("(64, 64)", "(8,)")]:
        assert old in block, old
        block = block.replace(old, new)
    scope: dict = {}
    exec(compile(block.replace("placement_strategy=", "num_cpus=0.5, placement_strategy="), "docs/scaling.md", "exec"),
         scope)
    assert scope["trajectories"].trajectories["observation/frame"].shape == (4, 64, 4)


def test_an_out_of_range_action_is_the_envs_action_range_error_naming_the_actor(ray_cluster):
    from tests.batchers.test_batcher_action_range import BAD, GOOD, InfoActionAgent

    # The actor's RL_Batcher steps in the actor's process: the worker processes' own message is
    # test_batcher_action_range's.
    with RayBatcher(3, InfoActionAgent, {}, CartPole, {"n_envs": 4, "autoreset": True}, 0, [0],
                    agent_info=GOOD) as b:
        b.reset()
        b.execute(agent_info=BAD)
        with pytest.raises(ActionRangeError, match=r"^actor 0: action\['action'\] must be in "
                                                   r"Discrete\(2\), the integers in \[0, 1\], got 2 at env ids 1"):
            b.get()
        with pytest.raises(BatcherStateError, match="failed"):
            b.execute()
