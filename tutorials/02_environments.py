"""Tutorial 2: environments — gymnasium adapters, torch simulators, auto-reset, DeviceEnv, seeding.

Every rlstruct environment is a ``VecEnv``: ``n_envs()`` environments stepped together, exchanging
DictTensors. The protocol is rlstructures' (``reset`` gives ``(observation, ids)``; ``step`` gives
``((observation_next, ids), (observation_running, ids_running))``) on top of gymnasium 1.x
(terminated and truncated are kept apart, seeds go through ``reset``).

Run it with ``python tutorials/02_environments.py``. Size knob: the environment variable
``RLSTRUCT_TUTORIAL_SCALE`` (float, default 1.0) scales the number of environments and steps of the
speed comparison; the tests run every tutorial with a small value.
"""

from __future__ import annotations

import os
import time

import gymnasium as gym
import numpy as np
import torch

from rlstruct import DictTensor
from rlstruct.envs import CartPole, DeviceEnv, GymEnv, GymEnvInf, make_env

SCALE = float(os.environ.get("RLSTRUCT_TUTORIAL_SCALE", "1.0"))


class Corridor(gym.Env):
    """A corridor of ``length`` cells (a reset option); action 1 walks forward, 0 stays.

    The observation is a Dict space: rlstruct gives each entry its own key. Reward -0.1 per step,
    +1 on reaching the end, which terminates the episode.
    """

    def __init__(self):
        self.observation_space = gym.spaces.Dict(
            {"position": gym.spaces.Discrete(100), "remaining": gym.spaces.Box(0.0, 100.0, (1,), np.float32)}
        )
        self.action_space = gym.spaces.Discrete(2)

    def _obs(self):
        return {"position": self.position, "remaining": np.array([self.length - self.position], np.float32)}

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.length = int(options["length"]) if options else 5
        self.position = 0
        return self._obs(), {}

    def step(self, action):
        self.position += int(action)
        terminated = self.position >= self.length
        return self._obs(), 1.0 if terminated else -0.1, terminated, False, {}


def forward(n: int) -> DictTensor:
    """n times action 1 (walk forward), one row per running env."""
    return DictTensor({"action": torch.ones(n, dtype=torch.long)})


def gymnasium_adapters() -> None:
    print("== 1. GymEnv: n gymnasium envs as one VecEnv (episodic)")
    env = GymEnv([Corridor() for _ in range(3)], seed=0)
    # env_info parametrises each env: row i becomes env i's reset(options=...). It lives on the CPU.
    obs, ids = env.reset(DictTensor({"length": torch.tensor([2, 4, 6])}))
    print("   keys:", list(obs.keys()))
    # A Dict space gives one key per entry; rlstruct adds reward, done, terminated, truncated,
    # initial_state (True right after a reset) and last_action.
    assert list(obs.keys())[:2] == ["position", "remaining"]
    assert obs["initial_state"].all() and not obs["done"].any()
    assert obs["remaining"][:, 0].tolist() == [2.0, 4.0, 6.0]
    assert ids.tolist() == [0, 1, 2]

    # Episodic: a finished env leaves the running set until the next reset. Each step takes one
    # action per *running* env, in the order of the last ids; it returns the observation each env
    # that acted reached (ids), then what the still-running ones act on next (ids_running).
    finished_at = {}
    t = 0
    while ids.numel() > 0:
        (obs_next, acted), (obs, ids) = env.step(forward(ids.numel()))
        t += 1
        for i in acted[obs_next["done"]].tolist():
            finished_at[i] = t
        # The running rows are the rows of obs_next that are not done, in the same order.
        assert torch.equal(ids, acted[~obs_next["done"]])
    assert finished_at == {0: 2, 1: 4, 2: 6}
    # Terminated (a goal reached) and truncated (a time limit) stay apart, as in gymnasium.
    assert obs_next["terminated"].all() and not obs_next["truncated"].any()
    env.close()

    print("== 2. GymEnvInf: auto-reset, every env always runs")
    env = GymEnvInf([Corridor() for _ in range(3)], seed=0)
    obs, ids = env.reset(DictTensor({"length": torch.tensor([2, 4, 6])}))
    n_done = torch.zeros(3, dtype=torch.long)
    for _ in range(12):
        (obs_next, acted), (obs, ids) = env.step(forward(3))
        # obs_next is the step's outcome (the terminal observation of a finished env, done=True);
        # obs is what the agent sees next: a finished env's row is its fresh reset observation.
        assert ids.tolist() == [0, 1, 2]
        assert torch.equal(obs["initial_state"], obs_next["done"])
        assert not obs["done"].any()
        n_done += obs_next["done"]
    # The reset options are reused at each auto-reset: 12 steps are 6, 3 and 2 episodes.
    assert n_done.tolist() == [6, 3, 2]
    env.close()

    print("== 3. GymEnv over a gymnasium vector env: one call per step, no per-env loop")
    vec = gym.make_vec("CartPole-v1", 4, vectorization_mode="vector_entry_point")
    env = GymEnv(vec, seed=0)
    obs, ids = env.reset()
    (obs_next, _), (obs, ids) = env.step(DictTensor({"action": torch.zeros(4, dtype=torch.long)}))
    assert obs_next["reward"].tolist() == [1.0] * 4 and obs["frame"].shape == (4, 4)
    env.close()


def torch_simulators() -> None:
    print("== 4. The torch simulators: gymnasium's classic control, batched on one device")
    # CartPole, Acrobot, MountainCar and Pendulum keep every env's state in a few tensors and step
    # all of them with batched kernels. They reproduce gymnasium's dynamics: put gymnasium's
    # CartPole in the torch env's state and both agree step for step.
    tenv = CartPole(1, seed=0)
    obs, _ = tenv.reset()
    genv = gym.make("CartPole-v1")
    genv.reset(seed=0)
    genv.unwrapped.state = tenv.get_state()["physics"][0].numpy().copy()
    rng = np.random.default_rng(0)
    steps = 0
    while True:
        a = int(rng.integers(2))
        (t_next, _), _ = tenv.step(DictTensor({"action": torch.tensor([a])}))
        g_obs, g_reward, g_term, g_trunc, _ = genv.step(a)
        assert torch.allclose(t_next["frame"][0], torch.from_numpy(g_obs), atol=1e-6)
        assert bool(t_next["terminated"][0]) == g_term and float(t_next["reward"][0]) == g_reward
        steps += 1
        if g_term or g_trunc:
            break
    print(f"   torch CartPole == gymnasium CartPole for a whole episode ({steps} steps)")
    genv.close()

    # Episodic vs auto-reset, as for GymEnv: the running set shrinks to nothing, or stays full.
    n = 64
    episodic = CartPole(n, seed=1)
    obs, ids = episodic.reset()
    lengths = torch.zeros(n, dtype=torch.long)
    while ids.numel() > 0:
        (obs_next, acted), (obs, ids) = episodic.step(DictTensor({"action": torch.randint(0, 2, (ids.numel(),))}))
        lengths[acted] += 1
    print(f"   {n} random-policy episodes, mean length {lengths.float().mean():.1f}")
    assert (lengths > 0).all()
    autoreset = CartPole(n, seed=1, autoreset=True)
    obs, ids = autoreset.reset()
    n_episodes = 0
    for _ in range(100):
        (obs_next, acted), (obs, ids) = autoreset.step(DictTensor({"action": torch.randint(0, 2, (n,))}))
        # Episode boundaries are flags (done, then initial_state on the next row), never dropped rows.
        assert ids.numel() == n and torch.equal(obs["initial_state"], obs_next["done"])
        n_episodes += int(obs_next["done"].sum())
    assert n_episodes > n  # 100 steps of a random policy: every env finished a few episodes

    # The point of torch simulators: many envs, one process, no Python loop over envs.
    n_big, T = max(256, int(20_000 * SCALE)), max(10, int(50 * SCALE))
    big = CartPole(n_big, seed=0, autoreset=True)
    big.reset()
    action = DictTensor({"action": torch.zeros(n_big, dtype=torch.long)})
    t0 = time.perf_counter()
    for _ in range(T):
        big.step(action)
    torch_rate = n_big * T / (time.perf_counter() - t0)
    n_gym = 16
    glist = GymEnvInf([gym.make("CartPole-v1") for _ in range(n_gym)], seed=0)
    glist.reset()
    action = DictTensor({"action": torch.zeros(n_gym, dtype=torch.long)})
    t0 = time.perf_counter()
    for _ in range(T):
        glist.step(action)
    gym_rate = n_gym * T / (time.perf_counter() - t0)
    glist.close()
    print(f"   {n_big} torch CartPoles: {torch_rate:,.0f} steps/s; "
          f"{n_gym} gymnasium CartPoles: {gym_rate:,.0f} steps/s")


def device_env() -> None:
    print("== 5. DeviceEnv: the one place where observations and actions change device")
    # An agent on a GPU wants observations on the GPU; a gymnasium env produces them on the CPU.
    # DeviceEnv(env, from_device, to_device) moves observations to to_device and actions back.
    same = DeviceEnv(CartPole(4, seed=0), "cpu", "cpu")
    obs, ids = same.reset()
    # When both devices are the same, nothing is copied (structures' .to returns self).
    assert obs.device() == torch.device("cpu")
    if torch.cuda.is_available():
        env = DeviceEnv(GymEnv([gym.make("CartPole-v1") for _ in range(4)], seed=0), "cpu", "cuda:0")
        obs, ids = env.reset()
        (obs_next, _), (obs, ids) = env.step(DictTensor({"action": torch.zeros(4, dtype=torch.long, device="cuda:0")}))
        assert obs["frame"].device.type == "cuda" and ids.device.type == "cuda"
        print("   gymnasium on the CPU, observations and actions on cuda:0")
        # The torch simulators can also live on the GPU themselves: then no copy at all.
        assert make_env("CartPole-v1", 4, device="cuda:0").device == torch.device("cuda:0")
    else:
        # Without a GPU, the "meta" device (shapes, no data) stands in for one: observations arrive
        # there. (A meta action has no data to copy back, so we stop at reset.)
        env = DeviceEnv(GymEnv([gym.make("CartPole-v1") for _ in range(4)], seed=0), "cpu", "meta")
        obs, ids = env.reset()
        assert obs["frame"].device.type == "meta" and ids.device.type == "meta"
        print("   no GPU here: gymnasium on the CPU, observations delivered on the meta device")
    env.close()


def seeding_and_state() -> None:
    print("== 6. Seeding, get_state and set_state")
    # Same seed, same episodes. For the torch simulators env k's episodes depend on (seed, k) only,
    # not on how many envs there are or on the device.
    few, _ = CartPole(4, seed=3).reset()
    many, _ = CartPole(1000, seed=3).reset()
    assert torch.equal(few["frame"], many["frame"][:4])
    other, _ = CartPole(4, seed=4).reset()
    assert not torch.equal(few["frame"], other["frame"])
    # GymEnv derives one reset seed per env from its seed, distinct across envs and across adapters
    # built with neighbouring seeds (batcher workers get seeds 0, 1, 2, ...).
    a, _ = GymEnv([gym.make("CartPole-v1") for _ in range(3)], seed=7).reset()
    b, _ = GymEnv([gym.make("CartPole-v1") for _ in range(3)], seed=7).reset()
    c, _ = GymEnv([gym.make("CartPole-v1") for _ in range(3)], seed=8).reset()
    assert torch.equal(a["frame"], b["frame"]) and not torch.equal(a["frame"], c["frame"])

    # The torch simulators expose their whole state, RNG included, as a DictTensor: snapshot, run,
    # restore, run again with the same actions, and you get the same observations.
    env = CartPole(32, seed=1, autoreset=True)
    env.reset()
    g = torch.Generator().manual_seed(0)
    actions = [DictTensor({"action": torch.randint(0, 2, (32,), generator=g)}) for _ in range(60)]
    for act in actions[:20]:
        env.step(act)
    snapshot = env.get_state()
    print("   state:", snapshot)

    def run(e) -> torch.Tensor:
        """The next 40 observations the agent sees, [40, 32, 4] (restarts included)."""
        return torch.stack([e.step(act.to(e.device))[1][0]["frame"].cpu() for act in actions[20:]])

    first = run(env)
    env.set_state(snapshot)
    assert torch.equal(first, run(env))
    # The state moves to another env (another seed, another device): it continues the same way.
    target = "cuda:0" if torch.cuda.is_available() else "cpu"
    twin = CartPole(32, seed=12345, autoreset=True, device=target)
    twin.set_state(snapshot)
    assert torch.allclose(first, run(twin))
    assert (twin.get_state()["episode"].cpu() > snapshot["episode"]).any()
    # Those 40 steps cross episode ends, so the fresh initial states matched too: the RNG is in the state.
    print(f"   restored on {target}: the next {first.shape[0]} steps replay exactly")


def factory() -> None:
    print("== 7. make_env: one call, any backend")
    # make_env is what you give a batcher as create_env: a module-level function of plain arguments.
    t = make_env("CartPole-v1", 8, backend="torch", autoreset=True, seed=0)
    g = make_env("CartPole-v1", 8, backend="gymnasium", autoreset=True, seed=0)
    assert t.action_space == g.action_space and t.observation_space.shape == g.observation_space.shape
    assert t.autoreset and g.autoreset and t.n_envs() == g.n_envs() == 8
    print("  ", t, "|", g)
    g.close()


def main() -> None:
    torch.manual_seed(0)
    gymnasium_adapters()
    torch_simulators()
    device_env()
    seeding_and_state()
    factory()
    print("tutorial 02: all claims hold")


if __name__ == "__main__":
    main()
