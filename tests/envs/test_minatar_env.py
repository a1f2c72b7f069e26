"""The torch MinAtar env around every game of its table: shapes, state I/O, per-env episodes, sticky actions, the
time limit, the auto-reset and ``step_into``, on every available device."""

from __future__ import annotations

import pytest
import torch

from rlstruct import DictTensor
from rlstruct.envs import make_env
from rlstruct.envs.minatar import GAMES, MinAtarEnv
from rlstruct.envs.minatar._env import game
from rlstruct.errors import BatchSizeError, EnvStateError, SpaceError
from tests.conftest import device_params

NAMES = list(GAMES)


def _actions(env: MinAtarEnv, n_steps: int, seed: int = 0) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(0, env.n_actions, (env.n_envs(),), generator=gen).to(env.device) for _ in range(n_steps)]


def _run(env: MinAtarEnv, actions: list[torch.Tensor]) -> list[DictTensor]:
    out = []
    for a in actions:
        (nxt, _), (run, _) = env.step(DictTensor({"action": a}))
        out += [nxt, run]
    return out


def _same(a: list[DictTensor], b: list[DictTensor], rows: slice = slice(None)) -> None:
    for x, y in zip(a, b, strict=True):
        for k in x.keys():
            assert torch.equal(x[k][rows].cpu(), y[k][rows].cpu()), k


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("name", NAMES)
def test_shapes_and_dtypes_are_gymnasiums(name, device):
    env = make_env(f"MinAtar/{name}-v1", 4, backend="torch", device=device, autoreset=True)
    obs, ids = env.reset()
    channels = len(game(name)[0].channels)
    assert obs["frame"].shape == (4, 10, 10, channels) and obs["frame"].dtype == torch.bool
    assert env.observation_space.shape == (10, 10, channels) and env.observation_space.dtype == bool
    assert env.max_episode_steps == 1000 and ids.tolist() == [0, 1, 2, 3]
    (nxt, _), (run, _) = env.step(DictTensor({"action": torch.zeros(4, dtype=torch.int64, device=device)}))
    for o in (obs, nxt, run):
        assert o["reward"].dtype == torch.float32 and o["last_action"].dtype == torch.int64
        assert {o[k].dtype for k in ("done", "terminated", "truncated", "initial_state")} == {torch.bool}
        assert o.device() == torch.device(device)


@pytest.mark.parametrize("name", NAMES)
def test_spaces_are_the_gymnasium_backends(name):
    pytest.importorskip("minatar", reason="the gymnasium backend is the minatar package (rlstruct[minatar])")
    env = make_env(f"MinAtar/{name}-v1", 4, backend="torch")
    gym_env = make_env(f"MinAtar/{name}-v1", 1, backend="gymnasium")
    assert gym_env.observation_space.shape == env.observation_space.shape
    assert gym_env.action_space == env.action_space


@pytest.mark.parametrize("name", NAMES)
def test_env_k_plays_the_same_episodes_whatever_n_envs(name):
    """Over 70 steps with a 24-step limit, so that every env plays at least three episodes whichever game (Freeway
    ends by its own clock only, at 2500 steps): the seeded episodes after each restart are env k's too."""
    settings = {"seed": 5, "autoreset": True, "max_episode_steps": 24}
    small, big = MinAtarEnv(name, 3, **settings), MinAtarEnv(name, 8, **settings)
    small.reset(), big.reset()
    acts = _actions(big, 70)
    ran = _run(big, acts)
    _same(_run(small, [a[:3] for a in acts]), ran, slice(0, 3))
    assert (sum(x["done"].long() for x in ran[::2]) >= 2).all()  # every env restarted twice at least
    # The envs split over processes (env_index: the global index of the first row) replay the same envs' episodes.
    tail = make_env(f"MinAtar/{name}-v1", 5, backend="torch", env_index=3, **settings)
    tail.reset()
    for x, y in zip(_run(tail, [a[3:] for a in acts]), ran, strict=True):
        assert all(torch.equal(x[k], y[k][3:]) for k in x.keys())


@pytest.mark.parametrize("device", device_params())
@pytest.mark.parametrize("name", NAMES)
def test_set_state_continues_exactly(name, device):
    env = MinAtarEnv(name, 6, seed=1, autoreset=True, device=device)
    env.reset()
    _run(env, _actions(env, 40, seed=1))
    state = env.get_state()
    other = MinAtarEnv(name, 6, seed=9, autoreset=True)
    other.set_state(state)
    acts = _actions(env, 60, seed=2)
    _same(_run(env, acts), _run(other, [a.cpu() for a in acts]))


@pytest.mark.parametrize("name", NAMES)
def test_step_into_is_step(name):
    a, b = MinAtarEnv(name, 5, autoreset=True), MinAtarEnv(name, 5, autoreset=True)
    obs, _ = a.reset()
    b.reset()
    nxt_buf, run_buf = obs.clone(), obs.clone()
    for act in _actions(a, 50):
        (nxt, _), (run, _) = a.step(DictTensor({"action": act}))
        b.step_into(DictTensor({"action": act}), nxt_buf, run_buf)
        _same([nxt, run], [nxt_buf, run_buf])


def test_graph_state_round_trip():
    env = MinAtarEnv("Breakout", 4, autoreset=True)
    env.reset()
    state = {k: v.clone() for k, v in env.graph_state().items()}
    first = _run(env, _actions(env, 20))
    env.set_graph_state(state)
    _same(first, _run(env, _actions(env, 20)))
    assert MinAtarEnv("Breakout", 2).graph_state() is None


def test_sticky_actions_repeat_the_previous_action_one_time_in_ten():
    # Freeway does not end within these steps; alternating its minimal actions 1 and 2 (the full-set 2 and 4), a
    # step that plays the previous played action instead of a different given one is a sticky step.
    env = MinAtarEnv("Freeway", 256, autoreset=True, seed=3)
    env.reset()
    full = env._action_set
    previous = env.get_state()["sticky_action"]
    repeats, chances = 0, 0
    for t in range(40):
        a = torch.full((256,), 1 + t % 2, dtype=torch.int64)
        env.step(DictTensor({"action": a}))
        played = env.get_state()["sticky_action"]
        differs = previous != full[a]
        repeats += int((differs & (played == previous)).sum())
        chances += int(differs.sum())
        previous = played
    assert chances > 7000 and abs(repeats / chances - 0.1) < 0.015
    never = MinAtarEnv("Breakout", 64, autoreset=True, sticky_action_prob=0.0)
    never.reset()
    never.step(DictTensor({"action": torch.full((64,), 2)}))
    assert (never.get_state()["sticky_action"] == 3).all()


def test_time_limit_truncates_and_restarts():
    env = make_env("MinAtar/Freeway-v1", 3, backend="torch", autoreset=True, max_episode_steps=5)
    env.reset()
    for t in range(1, 11):
        (nxt, _), (run, _) = env.step(DictTensor({"action": torch.zeros(3, dtype=torch.int64)}))
        assert nxt["truncated"].tolist() == [t % 5 == 0] * 3 and not nxt["terminated"].any()
        assert run["initial_state"].tolist() == [t % 5 == 0] * 3 and not run["done"].any()
    assert env.get_state()["episode"].tolist() == [2, 2, 2]


def test_episodic_envs_drop_out_until_reset():
    env = MinAtarEnv("Breakout", 6, seed=2)
    env.reset()
    ids, finished = torch.arange(6), []
    while ids.numel():
        (nxt, nxt_ids), (run, ids) = env.step(DictTensor({"action": torch.zeros(ids.numel(), dtype=torch.int64)}))
        finished += nxt_ids[nxt["done"]].tolist()
        assert torch.equal(ids, nxt_ids[~nxt["done"]])
    assert sorted(finished) == list(range(6))
    with pytest.raises(EnvStateError, match="every one of the 6 episodic envs has finished"):
        env.step(DictTensor({"action": torch.zeros(0, dtype=torch.int64)}))
    assert env.reset()[0]["initial_state"].all()


def test_errors():
    with pytest.raises(ValueError, match="game must be one of"):
        MinAtarEnv("Pong", 2)
    with pytest.raises(ValueError, match="sticky_action_prob must be in"):
        MinAtarEnv("Breakout", 2, sticky_action_prob=1.5)
    env = MinAtarEnv("Breakout", 2, autoreset=True)
    with pytest.raises(EnvStateError, match="before reset"):
        env.step(DictTensor({"action": torch.zeros(2, dtype=torch.int64)}))
    env.reset()
    with pytest.raises(BatchSizeError, match="n_envs=2"):
        env.set_state(MinAtarEnv("Breakout", 3, autoreset=True).reset() and _state_of(3))
    with pytest.raises(SpaceError, match="keys"):
        env.set_state(_state_of(2, "Asterix"))
    with pytest.raises(SpaceError, match="integer tensor"):
        env.step(DictTensor({"action": torch.zeros(2)}))


def _state_of(n: int, name: str = "Breakout") -> DictTensor:
    env = MinAtarEnv(name, n, autoreset=True)
    env.reset()
    return env.get_state()


@pytest.mark.parametrize("name", NAMES)
def test_dense_restart_is_the_sparse_one(name):
    # The accelerators' step (every env draws a fresh state, capturable) gives the CPU's results.
    from rlstruct.envs.minatar._env import autoreset_step, autoreset_step_sparse

    env = MinAtarEnv(name, 16, autoreset=True, max_episode_steps=30)
    env.reset()
    dense = sparse = env.graph_state()
    for a in _actions(env, 120):
        dense, out_d = autoreset_step(env, dense, a)
        sparse, out_s = autoreset_step_sparse(env, sparse, a)
        assert out_d.keys() == out_s.keys() and all(torch.equal(out_d[k], out_s[k]) for k in out_d)
        assert all(torch.equal(dense[k], sparse[k]) for k in dense)


@pytest.mark.parametrize("device", device_params())
def test_a_random_start_puts_env_k_r_k_steps_into_its_episode_whatever_n_envs(device):
    # 64 envs, starts of at most 3 steps: every length from 0 to 3 is drawn, each env's elapsed_steps is its start's
    # length, and env k stands where the same env of another batch (or of another process: env_index; or on the
    # CPU: the accelerators restart every env at each step) stands.
    env = MinAtarEnv("Freeway", 64, seed=3, autoreset=True, random_start_steps=3, device=device)
    obs, _ = env.reset()
    elapsed = env.get_state()["elapsed_steps"].cpu()
    assert sorted(set(elapsed.tolist())) == [0, 1, 2, 3]
    assert obs["initial_state"].all() and not obs["done"].any()
    assert torch.equal(obs["last_action"], env.get_state()["last_action"])  # what the start played last
    tail = MinAtarEnv("Freeway", 4, seed=3, env_index=60, autoreset=True, random_start_steps=3)
    tail_obs, _ = tail.reset()
    assert torch.equal(tail_obs["frame"], obs["frame"][60:].cpu())
    assert all(torch.equal(v, env.get_state()[k][60:].cpu()) for k, v in tail.get_state().items())
    # The next reset draws other starts (the next episode's), and no start is the default.
    env.reset()
    assert not torch.equal(env.get_state()["elapsed_steps"].cpu(), elapsed)
    plain = MinAtarEnv("Freeway", 64, seed=3, autoreset=True)
    plain.reset()
    assert not plain.get_state()["elapsed_steps"].any()


def test_random_starts_spread_the_ends_of_games_of_one_length_over_the_steps():
    # Games that all last as long (Freeway's 2,500 steps; here a time limit of 50 steps, which a Freeway game
    # outlasts): started together, 32 envs end in one step; after random starts of up to one game, at most a few end
    # in any step, and each env still ends once in a game's length (its start's steps count as the game's).
    def ends(random_start_steps: int) -> torch.Tensor:
        env = MinAtarEnv("Freeway", 32, seed=0, autoreset=True, random_start_steps=random_start_steps,
                         max_episode_steps=50)
        env.reset()
        done = torch.stack([d["done"] for d in _run(env, _actions(env, 50))[::2]])
        return done.sum(1)

    together, spread = ends(0), ends(49)
    assert together.max() == 32 and int(together.sum()) == 32
    assert spread.max() <= 4 and int(spread.sum()) == 32


def test_random_start_steps_is_checked_and_evaluation_envs_start_without_it():
    from rlstruct.algos._env_spec import evaluation_env_kwargs

    for bad in (-1, 2.5, True):
        with pytest.raises(ValueError, match=r"random_start_steps must be an int >= 0 .* got " + repr(bad)):
            MinAtarEnv("Freeway", 2, random_start_steps=bad)
    kwargs = {"sticky_action_prob": 0.1, "random_start_steps": 2_500}
    assert evaluation_env_kwargs("MinAtar/Freeway-v1", "auto", kwargs, None) == {**kwargs, "random_start_steps": 0}
    evaluated = make_env("MinAtar/Freeway-v1", 2, backend="torch",
                         backend_kwargs=evaluation_env_kwargs("MinAtar/Freeway-v1", "auto", kwargs, None))
    evaluated.reset()
    assert not evaluated.get_state()["elapsed_steps"].any()


@pytest.mark.parametrize("name", NAMES)
def test_a_reset_state_has_one_tensor_per_key(name):
    """The compiled step writes the state in place, so no two keys of a reset state may be one tensor (Breakout's
    rules start last_x and last_y as ball_x and ball_y): the keys that share are found once, when the game is made,
    and reset copies them, with the values the rules gave."""
    rules, _ = game(name)
    u = torch.rand(5, rules.n_reset_draws, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    raw = dict(zip(rules.keys, rules.rules.reset(u, False, *rules._no_rows), strict=True))
    state = rules.reset(u, False)
    tensors = list(state.values())
    assert all(a is not b for i, a in enumerate(tensors) for b in tensors[:i])
    assert all(torch.equal(state[k], raw[k]) for k in rules.keys)
    shared = {k for k, s in zip(rules.keys, rules._shared, strict=True) if s}
    assert shared == ({"last_x", "last_y"} if name == "Breakout" else set())
