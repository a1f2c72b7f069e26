"""Tutorial 4: batchers — many CPU processes, one process with thousands of envs, asynchrony, timings.

``RL_Batcher`` runs an agent on vectorized environments and returns ``Trajectories``. One API, three
ways to run it:

* ``n_processes=k``: ``k`` spawned worker processes, each with its own env and agent, writing into
  one shared buffer (best for gymnasium envs, which step one env at a time in Python);
* ``n_processes=1`` with a torch simulator of thousands of envs (on a GPU: ``device="cuda:k"``):
  one worker, no Python loop over envs;
* ``n_processes=0``: the same loop in the calling process (debugging, evaluation).

On a GPU, ``cuda_graph=True`` replays each acquisition as one CUDA graph (part 5, run when a GPU is present).
``zero_copy=True`` makes ``get`` return views of the batcher's buffer instead of copies (part 6).

The protocol is ``reset`` -> ``execute`` (returns at once) -> ``get`` -> ``(trajectories, n_running)``,
and ``update(weights)`` while nothing is pending.

Workers are *spawned*: they import this script again (as ``__mp_main__``, so ``main()`` does not
run there) to find ``create_agent`` and ``create_env``. That is why those two are defined at module
level and why the script keeps its ``if __name__ == "__main__":`` guard.

Run it with ``python tutorials/04_batchers.py``. Size knob: the environment variable
``RLSTRUCT_TUTORIAL_SCALE`` (float, default 1.0) scales the number of environments, steps and
iterations; the tests run every tutorial with a small value.
"""

from __future__ import annotations

import os
import time

import torch
from torch import nn

from rlstruct import DictTensor, RL_Agent, replay_agent
from rlstruct.batchers import RL_Batcher
from rlstruct.envs import make_env
from rlstruct.errors import BatcherStateError

SCALE = float(os.environ.get("RLSTRUCT_TUTORIAL_SCALE", "1.0"))
N_PROCESSES = 2
ENVS_PER_PROCESS = max(4, int(16 * SCALE))
N_BIG = max(256, int(4096 * SCALE))
T = max(16, int(64 * SCALE))
N_ITERATIONS = max(3, int(8 * SCALE))


def make_policy() -> nn.Module:
    return nn.Sequential(nn.Linear(4, 32), nn.Tanh(), nn.Linear(32, 2))


class PolicyAgent(RL_Agent):
    """Samples when ``agent_info["stochastic"]`` is true, else acts greedily; returns its logits too."""

    def __init__(self, device: str = "cpu"):
        self.device = torch.device(device)
        self.model = make_policy().to(self.device)
        self.generator = torch.Generator(device=self.device)

    def seed(self, seed: int) -> None:
        self.generator.manual_seed(seed)

    def update(self, state_dict) -> None:
        self.model.load_state_dict(state_dict)

    def __call__(self, state, observation, agent_info, history=None):
        logits = self.model(observation["frame"])
        sampled = torch.multinomial(logits.softmax(-1), 1, generator=self.generator).squeeze(1)
        # non_blocking: agent_info lives on the CPU; a blocking copy would also stop a CUDA graph capture (part 5).
        stochastic = agent_info["stochastic"].to(self.device, non_blocking=True)
        action = torch.where(stochastic, sampled, logits.argmax(-1))
        return DictTensor({"action": action, "logits": logits}), state


# Module level, so that spawned workers can import them. Each worker calls
# create_env(**env_args, seed=seeds[k]) and create_agent(**agent_args).
def create_agent(device: str = "cpu") -> PolicyAgent:
    return PolicyAgent(device)


def create_env(n_envs: int, seed: int, backend: str, autoreset: bool = True, device: str = "cpu"):
    return make_env("CartPole-v1", n_envs, seed=seed, backend=backend, autoreset=autoreset, device=device)


EXPLORE = DictTensor({"stochastic": torch.tensor([True])})
GREEDY = DictTensor({"stochastic": torch.tensor([False])})


def cpu_weights(model: nn.Module) -> dict[str, torch.Tensor]:
    return {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}


def many_processes() -> float:
    print(f"== 1. {N_PROCESSES} CPU processes x {ENVS_PER_PROCESS} gymnasium envs")
    with RL_Batcher(
        n_timesteps=T,
        create_agent=create_agent,
        agent_args={},
        create_env=create_env,
        env_args={"n_envs": ENVS_PER_PROCESS, "backend": "gymnasium"},
        n_processes=N_PROCESSES,
        seeds=[0, 1],  # one per worker; make_env derives distinct per-env seeds from each
        agent_info=EXPLORE,  # an example row: sizes the buffer, and is the default of reset()
        agent_seeds=[100, 101],
    ) as batcher:
        # Each worker is its own process; CPU workers start with CUDA hidden, so they never make a CUDA context.
        reports = batcher.worker_reports()
        assert len({r["pid"] for r in reports}) == N_PROCESSES and os.getpid() not in {r["pid"] for r in reports}
        assert all(r["environ"]["CUDA_VISIBLE_DEVICES"] == "" and not r["cuda_initialized"] for r in reports)

        batcher.reset()
        t0 = time.perf_counter()
        batcher.execute()
        first, n_running = batcher.get()
        rate = first.n_elems() * T / (time.perf_counter() - t0)
        # One trajectory per env (worker 0's envs first), T steps each: auto-reset envs never stop.
        B = N_PROCESSES * ENVS_PER_PROCESS
        assert first.n_elems() == B and n_running == B and first.trajectories.full()
        traj = first.trajectories
        print("   info:", list(first.info.keys()))
        print("   trajectories:", list(traj.keys()))
        assert list(first.info.keys()) == ["agent_info/stochastic"]  # a stateless agent: no agent_state/*
        assert {"action/action", "action/logits", "observation/frame", "_observation/reward"} <= set(traj.keys())
        # observation/* is step t, _observation/* is step t+1 (before an auto-reset): so they agree
        # one step apart except where an episode ended.
        same = ~traj["_observation/done"][:, :-1]
        assert torch.equal(traj["_observation/frame"][:, :-1][same], traj["observation/frame"][:, 1:][same])

        # The next execute continues where the last one stopped (envs and agent state carry over).
        batcher.execute()
        second, _ = batcher.get()
        cont = ~traj["_observation/done"][:, -1]
        assert torch.equal(second.trajectories["observation/frame"][cont, 0], traj["_observation/frame"][cont, -1])
    print(f"   {B} trajectories of {T} steps, {rate:,.0f} steps/s")
    return rate


def learner_step(agent: PolicyAgent, optimizer: torch.optim.Optimizer, trajectories) -> float:
    """Stands in for a real learner (see tutorials 5-7): replays the agent with gradients over a
    minibatch of trajectories and takes one optimizer step, here on the policy's entropy."""
    trajectories = trajectories.sample(min(256, trajectories.n_elems()))
    out = replay_agent(agent, trajectories)
    mask = trajectories.trajectories.mask()
    log_p = out["logits"].log_softmax(-1)
    entropy = -(log_p.exp() * log_p).sum(-1)
    loss = -(entropy * mask).sum() / mask.sum()
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    return float(loss.detach())


def one_process_many_envs(cpu_rate: float) -> None:
    print(f"== 2. One worker process x {N_BIG} torch envs, collecting while the learner computes")
    learner = PolicyAgent("cpu")
    learner.seed(0)
    optimizer = torch.optim.Adam(learner.model.parameters(), lr=1e-2)
    with RL_Batcher(T, create_agent, {}, create_env, {"n_envs": N_BIG, "backend": "torch"}, 1, [0],
                    agent_info=EXPLORE, agent_seeds=[7]) as batcher:
        batcher.update(cpu_weights(learner.model))
        batcher.reset()
        batcher.execute()
        trajectories, n = batcher.get()
        assert trajectories.n_elems() == N_BIG == n
        print(f"   {N_BIG * T / batcher.timings()['wait']:,.0f} steps/s in one process (vs {cpu_rate:,.0f} "
              f"with {N_PROCESSES} processes of gymnasium envs)")
        # update() reached the worker: replaying the agent with the weights it acted with gives back,
        # now with gradients, the logits the batcher stored.
        some = trajectories.sample(64)
        replayed = replay_agent(learner, some)
        assert torch.allclose(replayed["logits"], some.trajectories["action/logits"], atol=1e-5)

        # The protocol is a small state machine: no update() while an execute is pending, no get()
        # without one. Misuse is an error, never a deadlock.
        batcher.execute()
        try:
            batcher.update(cpu_weights(learner.model))
        except BatcherStateError as e:
            print("   update() while pending:", e)
        else:
            raise AssertionError("update() must be refused while an execute is pending")
        trajectories, n = batcher.get()

        # The asynchronous loop: while the worker collects batch k+1 with the weights of step k, the
        # learner trains on batch k; get(blocking=False) returns (None, None) until the batch is ready.
        # The price of the overlap: each batch was collected one update before the learner uses it.
        learn_s = wait_s = 0.0
        polls = 0
        for _ in range(N_ITERATIONS):
            batcher.update(cpu_weights(learner.model))
            batcher.execute()
            t0 = time.perf_counter()
            learner_step(learner, optimizer, trajectories)
            t1 = time.perf_counter()
            while True:
                nxt, n = batcher.get(blocking=False)
                if nxt is not None:
                    break
                polls += 1
                time.sleep(0.001)  # a real learner would do more useful work here
            t2 = time.perf_counter()
            learn_s, wait_s = learn_s + t1 - t0, wait_s + t2 - t1
            trajectories = nxt
        learner_step(learner, optimizer, trajectories)
        print(f"   {N_ITERATIONS} iterations: learner busy {learn_s:.2f} s, then waited {wait_s:.2f} s "
              f"({polls} non-blocking polls came back empty)")

        print("== 3. timings(): where the time goes")
        timings = batcher.timings()
        for phase in ("agent_forward", "env_step", "buffer_write", "copy", "wait", "gather"):
            print(f"   {phase:>14}: {timings[phase]:7.3f} s")
        # Phases are measured in the worker (agent_forward, env_step, buffer_write, copy) and in the
        # parent (wait: blocked in get; gather: copying the result out). Counters come along.
        n_executes = N_ITERATIONS + 2
        assert timings["env_steps"] == N_BIG * T * n_executes and timings["steps"] == T * n_executes
        batcher.reset_timings()
        assert all(v == 0 for v in batcher.timings().values())


def evaluation_batcher() -> None:
    print("== 4. An evaluation batcher: complete greedy episodes")
    # Episodic envs (autoreset=False) and n_timesteps at least the episode limit (500 for CartPole-v1):
    # one execute collects one whole episode per env. In-process (n_processes=0) is enough here.
    n_envs = max(16, int(128 * SCALE))
    policy = make_policy()
    with RL_Batcher(500, create_agent, {}, create_env, {"n_envs": n_envs, "backend": "torch", "autoreset": False},
                    0, [1234], agent_info=GREEDY) as evaluation:
        evaluation.update(cpu_weights(policy))
        evaluation.reset()
        evaluation.execute()
        episodes, n_running = evaluation.get()
    traj = episodes.trajectories
    rows = torch.arange(n_envs)
    last = traj.lengths - 1
    assert n_running == 0  # every episode finished
    assert traj["observation/initial_state"][:, 0].all()  # each trajectory starts an episode...
    assert traj["_observation/done"][rows, last].all()  # ...and ends it
    # Padding after an episode ends is unspecified: always mask.
    returns = (traj["_observation/reward"] * traj.mask()).sum(1)
    assert torch.equal(returns, traj.lengths.float())  # CartPole pays 1 per step
    print(f"   {n_envs} greedy episodes: mean return {returns.mean():.1f}, lengths {int(traj.lengths.min())}"
          f"..{int(traj.lengths.max())}")


def assert_same_batches(a: list, b: list) -> None:
    """Two runs collected the same trajectories, bit for bit, batch after batch."""
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for key in x.trajectories.keys():
            assert torch.equal(x.trajectories[key], y.trajectories[key]), key


def gpu_graph() -> None:
    print("== 5. On a GPU: each acquisition replayed as one CUDA graph (cuda_graph=True)")
    if not torch.cuda.is_available():
        print("   no GPU on this machine: skipped")
        return
    # On a GPU the eager loop launches a few hundred small kernels per step, and up to ~10^5 envs the GPU
    # waits for the launches. cuda_graph=True captures agent + env step + buffer writes of a whole
    # acquisition once (the first acquisition runs eagerly, the second captures) and then replays it in one
    # launch. The trajectories are the same bits; the env must be an auto-reset torch simulator.
    n = max(1024, int(65536 * SCALE))
    runs: dict[bool, tuple[list, float]] = {}
    weights = cpu_weights(make_policy())  # the same weights for both runs
    for cuda_graph in (False, True):
        with RL_Batcher(T, create_agent, {"device": "cuda"}, create_env,
                        {"n_envs": n, "backend": "torch", "device": "cuda"}, 0, [0],
                        agent_info=EXPLORE, agent_seeds=[7], device="cuda", cuda_graph=cuda_graph) as batcher:
            batcher.update(weights)
            batcher.reset()
            out = []
            for k in range(N_ITERATIONS):
                if k == 2:  # after the eager acquisition and the capture
                    torch.cuda.synchronize()
                    t0 = time.perf_counter()
                batcher.execute()
                out.append(batcher.get()[0])
            torch.cuda.synchronize()
            runs[cuda_graph] = out, n * T * (N_ITERATIONS - 2) / (time.perf_counter() - t0)
    assert_same_batches(runs[False][0], runs[True][0])
    print(f"   {n} envs on {torch.cuda.get_device_name()}: eager {runs[False][1]:,.0f} steps/s, "
          f"graph {runs[True][1]:,.0f} steps/s, the same trajectories")


def zero_copy_views() -> None:
    print("== 6. zero_copy=True: get() returns views of the buffer instead of copies")
    # By default get() copies each acquisition out of the buffer into fresh tensors, since the next execute()
    # overwrites the buffer. With zero_copy=True, get() returns views of the buffer just written and the next
    # acquisition writes into a second one: no copy, no fresh memory. A get()'s views stay valid until the
    # acquisition of the second execute() after it: long enough to learn on batch k while the worker collects
    # batch k+1 (the usual asynchronous loop); clone() what you keep longer.
    weights = cpu_weights(make_policy())
    runs: dict[bool, tuple[list, float]] = {}
    for zero_copy in (False, True):
        with RL_Batcher(T, create_agent, {}, create_env, {"n_envs": N_BIG, "backend": "torch"}, 1, [0],
                        agent_info=EXPLORE, agent_seeds=[7], zero_copy=zero_copy) as batcher:
            batcher.update(weights)
            batcher.reset()
            batcher.execute()
            trajectories, _ = batcher.get()
            kept = []
            for _ in range(N_ITERATIONS):
                batcher.execute()  # the worker writes batch k+1 into the other buffer...
                kept.append(trajectories.clone())  # ...while this process reads batch k (a learner would train)
                trajectories, _ = batcher.get()
            runs[zero_copy] = kept, batcher.timings()["gather"]
            frame = trajectories.trajectories["observation/frame"]
            # The views are [B, T, ...] over time-major [T, B, ...] storage: index as usual; reshape, not view.
            assert frame.shape == (N_BIG, T, 4) and frame.is_contiguous() != zero_copy
    assert_same_batches(runs[False][0], runs[True][0])
    print(f"   the same {N_ITERATIONS} batches; seconds get() spent copying out of the buffer: "
          f"{runs[False][1]:.3f} with copies, {runs[True][1]:.3f} with views")


def main() -> None:
    torch.manual_seed(0)
    # The learner (this process) shares the cores with the workers, which use one thread each:
    # leave them their cores, or intra-op threads fight over them and small ops get 10x slower.
    torch.set_num_threads(max(1, (os.cpu_count() or 1) - 1))
    cpu_rate = many_processes()
    one_process_many_envs(cpu_rate)
    evaluation_batcher()
    gpu_graph()
    zero_copy_views()
    print("tutorial 04: all claims hold")


if __name__ == "__main__":
    main()
