"""Data-parallel learners (algos/distributed.py): the world read from torchrun's variables, and gradient averaging
over gloo on loopback, with ranks spawned by the test, against one process learning on the whole batch."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn

from rlstruct.algos.distributed import (
    World,
    all_ranks_stop,
    average_gradients,
    broadcast_parameters,
    effective_batch,
    rank_seed,
    world_from_environment,
)
from rlstruct.errors import ConfigError

UPDATES = 4
BATCH = 32


def test_plain_run_is_one_rank():
    assert world_from_environment({}) == World(rank=0, size=1, local_rank=0)
    assert rank_seed(5, World()) == 5
    assert average_gradients(nn.Linear(2, 2), World()) == []
    assert effective_batch(4, 16, World()) == 64


def test_disjoint_rank_seeds():
    seeds = [rank_seed(0, World(rank=r, size=4, local_rank=r)) for r in range(4)]
    ranges = [set(range(s, s + 4096)) for s in seeds]
    assert all(not (a & b) for i, a in enumerate(ranges) for b in ranges[i + 1:])


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


def _update(model, optimizer, obs, actions, advantages) -> None:
    """An A2C step: policy-gradient surrogate plus value loss, means over the batch, clipped, Adam."""
    out = model(obs)
    logp = torch.distributions.Categorical(logits=out[:, :2]).log_prob(actions)
    value = out[:, 2]
    loss = -(logp * advantages).mean() + 0.5 * (value - advantages).pow(2).mean()
    optimizer.zero_grad()
    loss.backward()
    nn.utils.clip_grad_norm_(model.parameters(), 0.5)
    optimizer.step()


def _train(model, obs, actions, advantages, after_update=None) -> None:
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    for k in range(UPDATES):
        _update(model, optimizer, obs[k], actions[k], advantages[k])
        if after_update is not None:
            after_update()


def _flat(model: nn.Module) -> torch.Tensor:
    return torch.cat([p.detach().reshape(-1) for p in model.parameters()])


def _rank(rank: int, size: int, port: int, out: dict) -> None:
    torch.set_num_threads(1)
    world = World(rank=rank, size=size, local_rank=rank)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=size)
    try:
        model = _model(seed=100 + rank)  # different on purpose: the broadcast makes them equal
        broadcast_parameters(model, world)
        average_gradients(model, world)
        obs, actions, advantages = _data()
        share = slice(rank * BATCH // size, (rank + 1) * BATCH // size)
        identical = []

        def check() -> None:
            gathered = [torch.empty_like(_flat(model)) for _ in range(size)]
            dist.all_gather(gathered, _flat(model))
            identical.append(all(torch.equal(gathered[0], g) for g in gathered))

        _train(model, obs[:, share], actions[:, share], advantages[:, share], check)
        stop = all_ranks_stop(rank == size - 1, world)
        out[rank] = (_flat(model), identical, stop)
    finally:
        dist.destroy_process_group()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.timeout(120)
def test_two_ranks_match_one_process_on_the_whole_batch():
    """2 ranks of BATCH/2 rows each, gradients averaged, take the same Adam steps (after clipping) as 1 process of
    BATCH rows; the ranks' models are identical after every update; a stop on one rank stops both."""
    with mp.Manager() as manager:
        out = manager.dict()
        mp.spawn(_rank, args=(2, _free_port(), out), nprocs=2, join=True)
        results = dict(out)
    single = _model(seed=100)
    _train(single, *_data())
    for rank in range(2):
        params, identical, stop = results[rank]
        assert identical == [True] * UPDATES
        assert stop is True
        torch.testing.assert_close(params, _flat(single), rtol=1e-5, atol=1e-6)
    assert not torch.allclose(_flat(single), _flat(_model(seed=100)))  # the updates moved the model
