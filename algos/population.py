"""A population of seeds trained as one batched program: ``N`` networks of one architecture held as one module whose
parameters are stacked ``[N, ...]``, the per-member arithmetic of an update over it (gradient clipping, a masked
Adam step), and the env seeds of one batcher whose slice ``k`` is seeded as the solo run of seed ``k``.

Member ``k`` is its seed's run: its initial weights are those the solo run's seeded constructor draws, its gradient
is its own loss's (one backward over the summed losses: no parameter is shared), its update its own (Adam and the
clipping act on each member's slice), and its weights come back as the solo module's ``state_dict``.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch import nn
from torch.func import functional_call

from rlstruct.agents import RL_Agent
from rlstruct.algos._batched_layers import BATCHED, batchable, check_batchable
from rlstruct.algos._optim import Adam
from rlstruct.algos.distributions import Categorical, DiagGaussian
from rlstruct.envs import VecEnv
from rlstruct.errors import BatchSizeError, ConfigError
from rlstruct.seeding import check_seed
from rlstruct.structures import DictTensor, TemporalDictTensor

__all__ = ["Population", "PopulationAdam", "PopulationAgent", "MemberEnvs", "member_env_seeds", "create_member_envs"]

#: how a :class:`Population` computes its members' forwards (see :class:`Population`)
IMPLEMENTATIONS = ("batched", "vmap")


class _Apply(nn.Module):
    # functional_call swaps tensors into a module's forward only: this forward hands the swapped module to any fn.
    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module

    def forward(self, fn: Callable[..., Any], *inputs: Any) -> Any:
        return fn(self.module, *inputs)


class Population(nn.Module):
    """``N`` modules of one architecture as one: each parameter and buffer stacked ``[N, *shape]`` under the
    members' own names, so ``population.module`` is a member's architecture holding every member's tensors.

    One optimizer over :meth:`parameters` steps every member (Adam is elementwise: each member's update is its own).
    Inputs and outputs carry a leading member dimension ``[N, B, ...]``.

    Args:
        members: the modules (build each with the solo run's seeded constructor, so that member ``k`` starts with
            seed ``k``'s weights); their tensors are copied.
        implementation: how :meth:`call` computes the members' forwards: ``"batched"`` (batched layers: a linear
            layer as one ``baddbmm`` of the members' weights, a convolution as one grouped convolution; the
            networks of :mod:`~rlstruct.algos.networks` and :mod:`~rlstruct.algos.qnetworks` without recurrence or
            twin critics), ``"vmap"`` (:func:`torch.func.functional_call` under :func:`torch.vmap`: any module) or
            ``None``: ``"batched"`` for the networks it batches, else ``"vmap"``.

    Raises:
        ConfigError: no members, members of different architectures, an unknown ``implementation``, or
            ``"batched"`` with a module it cannot batch.

    >>> from rlstruct.algos.harness import seeded_model
    >>> from rlstruct.algos.qnetworks import QNetwork
    >>> pop = Population([seeded_model(s, QNetwork, 4, 2, (8,)) for s in range(3)])
    >>> pop.implementation, pop(torch.zeros(3, 5, 4)).shape, pop.module.q[0].weight.shape
    ('batched', torch.Size([3, 5, 2]), torch.Size([3, 8, 4]))
    >>> torch.equal(pop.member_state_dict(1)["q.0.weight"], seeded_model(1, QNetwork, 4, 2, (8,)).q[0].weight)
    True
    """

    def __init__(self, members: Sequence[nn.Module], *, implementation: str | None = None):
        super().__init__()
        members = list(members)
        if not members:
            raise ConfigError("members must hold at least one module, got none; pass one module per seed")
        if implementation is None:
            implementation = "batched" if batchable(members[0]) else "vmap"
        if implementation not in IMPLEMENTATIONS:
            raise ConfigError(f"implementation must be one of {list(IMPLEMENTATIONS)}, got {implementation!r}")
        _check_one_architecture(members)
        if implementation == "batched":
            check_batchable(members[0])
        self.n_members = len(members)
        self.implementation = implementation
        self.module = _stacked(members)
        self._apply_module = (_Apply(self.module),)  # a tuple: not registered (its tensors are self.module's)

    def map(self, fn: Callable[..., Any], *inputs: Any) -> Any:
        """``fn(member, *member_inputs)`` for every member, under :func:`torch.vmap`: inputs are tensors (or dicts
        and tuples of them) ``[N, ...]``, and so are the outputs. ``fn`` sees one member's module and its slice of
        each input, so it may be a whole loss (reductions over the batch stay within the member).

        >>> from rlstruct.algos.harness import seeded_model
        >>> from rlstruct.algos.qnetworks import QNetwork
        >>> pop = Population([seeded_model(s, QNetwork, 4, 2, (8,)) for s in range(3)])
        >>> pop.map(lambda m, x: m(x).pow(2).mean(), torch.ones(3, 5, 4)).shape
        torch.Size([3])
        """
        tensors = {f"module.{k}": v for k, v in self.module.named_parameters()}
        tensors.update({f"module.{k}": v for k, v in self.module.named_buffers()})
        apply = self._apply_module[0]

        def one(member_tensors: dict[str, torch.Tensor], *member_inputs: Any) -> Any:
            return functional_call(apply, member_tensors, (fn, *member_inputs))

        return torch.vmap(one)(tensors, *inputs)

    def call(self, method: str, *inputs: torch.Tensor) -> Any:
        """The members' ``method`` (``"forward"``, an actor-critic's ``"policy"``, ``"value"``, ``"policy_value"``)
        on inputs ``[N, B, ...]``: tensors ``[N, B, ...]``, or a distribution over ``[N, B]``.
        """
        if self.implementation == "batched":
            return BATCHED[type(self.module), method](self.module, *inputs)
        rebuild: list[Callable[[Sequence[torch.Tensor]], Any]] = []

        def one(member: nn.Module, *member_inputs: torch.Tensor) -> tuple[torch.Tensor, ...]:
            flat, build = _flatten(getattr(member, method)(*member_inputs))
            rebuild.append(build)
            return flat

        flat = self.map(one, *inputs)
        return rebuild[0](flat)

    def forward(self, *inputs: torch.Tensor) -> Any:
        """The members' forward on inputs ``[N, B, ...]`` (:meth:`call` of ``"forward"``)."""
        return self.call("forward", *inputs)

    def clip_grad_norms(self, max_norm: float, parameters: Sequence[torch.Tensor] | None = None) -> torch.Tensor:
        """Clips each member's gradient to ``max_norm``, its norm taken over its own slice of every parameter:
        ``clip_grad_norm_`` of each solo network (a member's coefficient ``min(1, max_norm / (norm + 1e-6))``).

        Args:
            max_norm: the norm each member's gradient is clipped to.
            parameters: a group of the stacked parameters (``None``: all of them), e.g. an actor-critic's actor
                (``population.module.policy_parameters()``); those without a gradient are skipped.

        Returns:
            ``float [N]``: each member's norm before clipping (``nan`` for a member with a ``nan`` gradient, whose
            coefficient is ``nan`` too: its gradient, and no other, stays ``nan``).

        >>> pop = Population([nn.Linear(3, 1, bias=False) for _ in range(2)])  # "vmap": no batched layers for it
        >>> pop.module.weight.grad = torch.tensor([[[3.0, 4.0, 0.0]], [[0.3, 0.4, 0.0]]])
        >>> pop.clip_grad_norms(1.0), pop.module.weight.grad.flatten(1).norm(dim=1)
        (tensor([5.0000, 0.5000]), tensor([1.0000, 0.5000]))
        """
        grads = [p.grad for p in (self.parameters() if parameters is None else parameters) if p.grad is not None]
        norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads])
        total = torch.linalg.vector_norm(norms, dim=0)
        coefficient = (max_norm / (total + 1e-6)).clamp(max=1.0)
        for g in grads:
            g.mul_(coefficient.view(-1, *(1,) * (g.dim() - 1)))
        return total

    def member_state_dict(self, k: int) -> dict[str, torch.Tensor]:
        """Member ``k``'s ``state_dict``, keyed as the solo module's (copies): for its checkpoint and its batcher."""
        self._check_member(k)
        return {key: value[k].detach().clone() for key, value in self.module.state_dict().items()}

    def load_member_state_dict(self, k: int, state: Mapping[str, torch.Tensor]) -> None:
        """Writes a solo module's ``state_dict`` into member ``k`` (a resumed member's checkpoint).

        Raises:
            ConfigError: ``state`` lacks a key of the architecture or holds another, or a tensor has another shape.
        """
        self._check_member(k)
        own = self.module.state_dict(keep_vars=True)
        if set(own) != set(state):
            differing = sorted(set(state) ^ set(own))
            raise ConfigError(f"state must hold the keys of member {k}'s state_dict, got {differing} differing; pass "
                              "the state_dict of a module of the population's architecture")
        with torch.no_grad():
            for key, value in own.items():
                if tuple(state[key].shape) != tuple(value.shape[1:]):
                    raise ConfigError(f"state[{key!r}] must have shape {tuple(value.shape[1:])}, got "
                                      f"{tuple(state[key].shape)}; pass the state_dict of a module of the population's "
                                      "architecture")
                value[k].copy_(state[key])

    def _check_member(self, k: int) -> None:
        if not 0 <= k < self.n_members:
            raise IndexError(f"k must be a member's index in [0, {self.n_members}), got {k}")


def _check_one_architecture(members: Sequence[nn.Module]) -> None:
    first = members[0]
    layout = {k: (v.shape, v.dtype, v.device) for k, v in first.state_dict().items()}
    for k, m in enumerate(members[1:], 1):
        other = {key: (v.shape, v.dtype, v.device) for key, v in m.state_dict().items()}
        if type(m) is not type(first) or other != layout:
            diff = sorted(key for key in set(layout) | set(other) if layout.get(key) != other.get(key))
            raise ConfigError(f"members must share one architecture, got members[{k}] ({type(m).__name__}) unlike "
                              f"members[0] ({type(first).__name__}) in {diff[:3] or 'type'}; build every member with "
                              "the same constructor and arguments, only the seed differing")


def _stacked(members: Sequence[nn.Module]) -> nn.Module:
    """A copy of ``members[0]`` whose every parameter and buffer is the members' stacked ``[N, ...]``."""
    stacked = copy.deepcopy(members[0])
    for name, _ in list(stacked.named_parameters()):
        owner, _, leaf = name.rpartition(".")
        value = torch.stack([m.get_parameter(name).detach() for m in members])
        setattr(stacked.get_submodule(owner), leaf, nn.Parameter(value))
    for name, _ in list(stacked.named_buffers()):
        owner, _, leaf = name.rpartition(".")
        setattr(stacked.get_submodule(owner), leaf, torch.stack([m.get_buffer(name) for m in members]))
    return stacked


def _flatten(out: Any) -> tuple[tuple[torch.Tensor, ...], Callable[[Sequence[torch.Tensor]], Any]]:
    """``out`` (a tensor, a distribution, or a tuple of them) as a tuple of tensors that vmap can return, and the
    function that builds it again from their stacked ``[N, ...]``."""
    if isinstance(out, torch.Tensor):
        return (out,), lambda t: t[0]
    if isinstance(out, Categorical):
        return (out.logits,), lambda t: Categorical(t[0])
    if isinstance(out, DiagGaussian):
        return (out.mean, out.log_std), lambda t: DiagGaussian(t[0], t[1])
    if isinstance(out, tuple):
        parts = [_flatten(o) for o in out]
        sizes = [len(flat) for flat, _ in parts]

        def build(t: Sequence[torch.Tensor]) -> tuple[Any, ...]:
            starts = [sum(sizes[:i]) for i in range(len(sizes))]
            return tuple(b(t[s:s + n]) for (_, b), s, n in zip(parts, starts, sizes))

        return tuple(x for flat, _ in parts for x in flat), build
    raise TypeError(f"a member's method must return tensors, distributions or tuples of them, got {type(out).__name__}")


# ------------------------------------------------------------------ per-member update arithmetic
class PopulationAdam:
    """Adam over a :class:`Population`'s stacked parameters (torch's fused kernel where it has one, as the solo
    learners' :func:`~rlstruct.algos.networks.make_adam`), with a masked step and each member's state in the solo
    optimizer's format.

    Adam is elementwise: given a member's gradient, the stacked kernel computes that member's update with the same
    operations as its solo optimizer. A member marked inactive (stopped, or diverged) keeps its parameters, moments and
    step count bitwise while the others step; its ``nan`` never reaches another member's slice.

    Args:
        population: the members.
        lr: learning rate.
        betas: the moving averages' coefficients.
        eps: added to the denominator.
        fused: torch's fused kernel (``None``: on CPU and CUDA, as ``make_adam``).

    Raises:
        ConfigError: (:meth:`step`) the active members have taken different numbers of steps, which one shared
            bias correction cannot serve.
    """

    def __init__(self, population: Population, lr: float, *, betas: tuple[float, float] = (0.9, 0.999),
                 eps: float = 1e-8, fused: bool | None = None):
        self.params = list(population.parameters())
        if fused is None:
            fused = self.params[0].device.type in ("cpu", "cuda")
        self.optimizer = Adam(self.params, lr=lr, betas=betas, eps=eps, fused=fused or None)
        self.n_members = population.n_members
        #: the steps each member has taken (host ints: a stop decision is taken on the host anyway)
        self.member_steps = [0] * self.n_members

    def zero_grad(self) -> None:
        """Drops every member's gradients."""
        self.optimizer.zero_grad(set_to_none=True)

    @torch.no_grad()
    def step(self, active: Sequence[bool] | None = None) -> None:
        """One Adam step of the members ``active`` marks (``None``: all); the others keep their parameters and
        state bitwise.

        Raises:
            BatchSizeError: ``active`` does not hold one flag per member.
        """
        active = [True] * self.n_members if active is None else [bool(a) for a in active]
        if len(active) != self.n_members:
            raise BatchSizeError(f"active must hold one flag per member ({self.n_members}), got {len(active)}")
        stepping = [k for k, a in enumerate(active) if a]
        if not stepping:
            return
        counts = sorted({self.member_steps[k] for k in stepping})
        if len(counts) > 1:
            raise ConfigError(f"the active members must have taken one number of steps (Adam's bias correction is "
                              f"shared), got {counts} (member_steps={self.member_steps}); step members resumed at "
                              "different counts in separate populations")
        frozen = [k for k, a in enumerate(active) if not a]
        params = [p for p in self.params if p.grad is not None]
        kept = []
        if frozen:
            index = torch.tensor(frozen, device=params[0].device)
            for p in params:
                state = self.optimizer.state.get(p, {})
                kept.append((p, index, [t.index_select(0, index) for t in (p, *_moments(state))]))
        for p in params:
            state = self.optimizer.state.get(p)
            if state:  # the shared count is the active members' (a resumed population sets it here)
                state["step"].fill_(counts[0])
        self.optimizer.step()
        for p, index, saved in kept:
            moments = _moments(self.optimizer.state[p])
            for target, value in zip((p, *moments), saved):
                target.index_copy_(0, index, value)
            if len(saved) == 1:  # the member's moments did not exist before this step: zeros, as a solo Adam's
                for target in moments:
                    target.index_fill_(0, index, 0.0)
        for k in stepping:
            self.member_steps[k] += 1

    def member_state_dict(self, k: int) -> dict[str, Any]:
        """Member ``k``'s optimizer state as its solo Adam's ``state_dict`` (parameters in the module's order)."""
        full = self.optimizer.state_dict()
        state = {}
        for i, s in full["state"].items():
            step = s["step"].clone().fill_(self.member_steps[k])
            state[i] = {"step": step, "exp_avg": s["exp_avg"][k].clone(), "exp_avg_sq": s["exp_avg_sq"][k].clone()}
        return {"state": state, "param_groups": copy.deepcopy(full["param_groups"])}

    def load_member_state_dict(self, k: int, state_dict: Mapping[str, Any]) -> None:
        """Writes a solo Adam's ``state_dict`` (of a module of the population's architecture) into member ``k``."""
        with torch.no_grad():
            for i, s in state_dict["state"].items():
                p = self.params[i]
                state = self.optimizer.state[p]
                if not state:
                    fused = bool(self.optimizer.param_groups[0]["fused"])  # the count on the device when fused
                    state["step"] = s["step"].detach().to(torch.float32, copy=True).to(p.device if fused else "cpu")
                    state["exp_avg"] = torch.zeros_like(p)
                    state["exp_avg_sq"] = torch.zeros_like(p)
                state["exp_avg"][k].copy_(s["exp_avg"])
                state["exp_avg_sq"][k].copy_(s["exp_avg_sq"])
            steps = [int(s["step"]) for s in state_dict["state"].values()]
            self.member_steps[k] = steps[0] if steps else 0


def _moments(state: Mapping[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return (state["exp_avg"], state["exp_avg_sq"]) if state else ()


# ------------------------------------------------------------------ seeds
def member_env_seeds(batcher_seeds: Sequence[tuple[int, int]],
                     n_envs: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """The seeds of each env of one training batcher of ``len(batcher_seeds) * n_envs`` envs whose envs
    ``k * n_envs, ...`` are those of member ``k``'s solo batcher: ``(env, agent)``, each ``(seed, env index)`` per env.

    A solo run's training batcher has one env seed and one agent seed (the run's seed and the role give them), and
    seeds env ``i`` by its global index: its reset draws from ``(env seed, i)``, its agent's draws from
    ``(agent seed, i, step)``. Row ``k * n_envs + i`` of the population is env ``i`` of member ``k``.

    Args:
        batcher_seeds: each member's solo training batcher's ``(env seed, agent seed)``.
        n_envs: the envs of each member's solo batcher.

    Raises:
        SeedError: a seed is not an int in ``[0, 2**31)``.
        ConfigError: no members, two members on one env seed, or ``n_envs < 1``.

    >>> env, agent = member_env_seeds([(0, 5000), (10000, 15000)], 2)
    >>> env
    [(0, 0), (0, 1), (10000, 0), (10000, 1)]
    >>> agent[2:]
    [(15000, 0), (15000, 1)]
    """
    pairs = [(check_seed(e, argument=f"batcher_seeds[{k}][0]"), check_seed(a, argument=f"batcher_seeds[{k}][1]"))
             for k, (e, a) in enumerate(batcher_seeds)]
    envs = [e for e, _ in pairs]
    if not pairs or len(set(envs)) != len(envs):
        raise ConfigError(f"batcher_seeds must hold one or more members on distinct env seeds, got {pairs}; pass "
                          "each member's solo training batcher's (env seed, agent seed)")
    if isinstance(n_envs, bool) or not isinstance(n_envs, int) or n_envs < 1:
        raise ConfigError(f"n_envs must be an int >= 1 (the envs of each member), got {n_envs!r}")
    env = [(e, i) for e, _ in pairs for i in range(n_envs)]
    agent = [(a, i) for _, a in pairs for i in range(n_envs)]
    return env, agent


def create_member_envs(*, n_envs: int, seed: int, env_index: int = 0, rows: Sequence[tuple[int, int]],
                       create_env: Callable[..., Any], env_args: Mapping[str, Any]) -> Any:
    """The batchers' ``create_env`` (with one seed) for a population: rows ``env_index, ..., env_index + n_envs - 1``
    of ``rows`` (:func:`member_env_seeds`'s ``env``), row ``g`` being env ``rows[g][1]`` of seed ``rows[g][0]``.

    The batcher's own ``seed`` does not enter: each row is seeded by its member. A worker whose rows are one
    member's gets ``create_env(**env_args, n_envs=n_envs, seed=..., env_index=...)``, any env; rows of several
    members in one worker need an env whose state is its :meth:`~rlstruct.envs.VecEnv.graph_state` (the auto-reset
    torch simulators), whose state is then the concatenation of the members' envs' states before any reset.

    Raises:
        ConfigError: rows of several members in one worker with an env without a graph state.
    """
    del seed  # each row is seeded by its member (see above)
    mine = list(rows[env_index:env_index + n_envs])
    runs: list[tuple[int, int, int]] = []  # (seed, first index, count) of consecutive rows of one member's envs
    for s, i in mine:
        if runs and runs[-1][0] == s and runs[-1][1] + runs[-1][2] == i:
            runs[-1] = (s, runs[-1][1], runs[-1][2] + 1)
        else:
            runs.append((s, i, 1))
    if len(runs) == 1:
        s, first, _ = runs[0]
        return create_env(**env_args, n_envs=n_envs, seed=s, env_index=first)
    env = create_env(**env_args, n_envs=n_envs, seed=runs[0][0], env_index=runs[0][1])
    state = env.graph_state()
    if state is None:
        env.close()
        return MemberEnvs([create_env(**env_args, n_envs=count, seed=s, env_index=first) for s, first, count in runs])
    parts = []
    for s, first, count in runs:
        part = create_env(**env_args, n_envs=count, seed=s, env_index=first)
        parts.append(part.graph_state())
        part.close()
    merged = {}
    for key, value in state.items():
        # the env dimension: where a member's part is shorter than the worker's env (no such dimension: not per env)
        dims = [d for d in range(value.dim()) if parts[0][key].shape[d] != value.shape[d]]
        merged[key] = torch.cat([p[key] for p in parts], dims[0]) if dims else value
    env.set_graph_state(merged)
    return env


# ------------------------------------------------------------------ the batchers' agent
def member_runs(rows: Sequence[tuple[int, int]], first: int, n_rows: int,
                members: Sequence[int]) -> list[tuple[int, int, int, int]]:
    """Rows ``first, ..., first + n_rows - 1`` of a population's batcher as runs of consecutive rows of one member:
    ``(member, start, stop, index)``, ``start:stop`` the run's rows among those ``n_rows`` and ``index`` the member's
    env index of its first row; ``rows`` holds ``(seed, index)`` per row (:func:`member_env_seeds`'s), ``members``
    each member's seed.

    >>> member_runs([(0, 0), (0, 1), (7, 0), (7, 1)], 1, 3, [0, 7])
    [(0, 0, 1, 1), (1, 1, 3, 0)]
    """
    member_of = {seed: k for k, seed in enumerate(members)}
    runs: list[tuple[int, int, int, int]] = []
    for j, (seed, index) in enumerate(rows[first:first + n_rows]):
        k = member_of[seed]
        if runs and runs[-1][0] == k and runs[-1][3] + (j - runs[-1][1]) == index:
            runs[-1] = (k, runs[-1][1], j + 1, runs[-1][3])
        else:
            runs.append((k, j, j + 1, index))
    return runs


class PopulationAgent(RL_Agent):
    """The agent of a population's training batcher: one agent per member, built by the algorithm's own factory, each
    acting on its member's rows with its member's weights and drawing as the solo run's agent does.

    A worker steps rows ``env_index, ...`` of the population (row ``g`` is env ``rows[g][1]`` of the member whose
    agent seed is ``rows[g][0]``, :func:`member_env_seeds`'s ``agent``): each member's agent is seeded for its rows by
    :meth:`seed_envs` with the member's agent seed and env index, so that its draws are the solo agent's, and a call
    hands each run of one member's rows to that member's agent (one call per member in the worker, none per env).
    :meth:`update` takes the weights of a module holding the members as ``"0"``, ``"1"``, ... (an
    ``nn.ModuleDict``): a member whose weights hold a NaN or an infinity keeps its last finite ones, so that a member
    that diverged cannot make the envs of the others fail (its own run ends as diverged when its learner finds it).

    Args:
        create_member: the algorithm's batcher agent factory.
        member_args: its keyword arguments (``device`` included).
        rows: each row's ``(agent seed, env index)``, rows of every worker of the batcher.
        members: each member's agent seed, in member order.
        n_rows: the rows each worker steps.
        device: the batcher's device (also in ``member_args``).

    An episodic batcher calls the agent on its running envs only, which this agent cannot tell apart: a population
    collects with auto-reset envs.
    """

    def __init__(self, *, create_member: Callable[..., RL_Agent], member_args: Mapping[str, Any],
                 rows: Sequence[tuple[int, int]], members: Sequence[int], n_rows: int, device: Any = None):
        self.agents = [create_member(**member_args) for _ in members]
        self.rows, self.members, self.n_rows = [tuple(r) for r in rows], list(members), n_rows
        self.runs = member_runs(self.rows, 0, n_rows, self.members)

    def _members_here(self) -> list[int]:
        return sorted({k for k, *_ in self.runs})

    def seed(self, seed: int) -> None:
        """Seeds every member's agent (a batcher of one seed per worker: no member's draws are its solo run's then)."""
        for k, agent in enumerate(self.agents):
            agent.seed(check_seed(seed + k, argument="seed"))

    def seed_envs(self, seed: int, env_index: int) -> None:
        """Seeds each member's agent for its rows among this worker's ``n_rows`` from ``env_index`` (the batcher's
        own ``seed`` does not enter: each row is seeded by its member, as its solo run seeds it)."""
        del seed
        self.runs = member_runs(self.rows, env_index, self.n_rows, self.members)
        for k, _, _, index in self.runs:
            self.agents[k].seed_envs(self.members[k], index)

    def initial_state(self, agent_info: DictTensor, B: int) -> DictTensor:
        """Each member's agent's initial state of its rows, side by side."""
        parts = [self.agents[k].initial_state(_rows(agent_info, start, stop), stop - start)
                 for k, start, stop, _ in self._runs(B)]
        return parts[0] if len(parts) == 1 else DictTensor.cat(parts)

    def _runs(self, B: int) -> list[tuple[int, int, int, int]]:
        if B != self.n_rows:
            raise BatchSizeError(f"a population's agent steps the {self.n_rows} rows of its worker at every call, got "
                                 f"{B}; collect with auto-reset envs (an episodic batcher calls the agent on its "
                                 "running envs only)")
        return self.runs

    def require_history(self) -> bool:
        """Whether a member's agent needs the acquisition's steps so far."""
        return any(agent.require_history() for agent in self.agents)

    def __call__(self, state, observation, agent_info, history=None):
        """Each run of one member's rows acted by that member's agent; the actions and states side by side."""
        runs = self._runs(observation.n_elems())
        if len(runs) == 1:
            return self.agents[runs[0][0]](state, observation, agent_info, history)
        actions, states = [], []
        for k, start, stop, _ in runs:
            action, new_state = self.agents[k](_rows(state, start, stop), observation.slice(start, stop),
                                               _rows(agent_info, start, stop),
                                               None if history is None else history.slice(start, stop))
            actions.append(action)
            states.append(new_state)
        return DictTensor.cat(actions), DictTensor.cat(states)

    def update(self, state_dict: Mapping[str, Any]) -> None:
        """Loads member ``k``'s weights from the keys ``"k.NAME"`` of ``state_dict``, for the members of this worker;
        a member whose weights are not all finite keeps its previous ones. Their finiteness is read in one host sync
        for every member (none per tensor)."""
        members = self._members_here()
        weights = {k: {name[len(f"{k}."):]: value for name, value in state_dict.items() if name.startswith(f"{k}.")}
                   for k in members}
        flags = [torch.stack([torch.isfinite(v).all() for v in weights[k].values()
                              if torch.is_tensor(v) and v.is_floating_point()] or [torch.tensor(True)]).all()
                 for k in members]
        for k, finite in zip(members, torch.stack(flags).tolist() if flags else []):
            if finite:
                self.agents[k].update(weights[k])

    def noise_state(self) -> torch.Tensor | None:
        """The members' agents' noise states, end to end (``None`` when one has none)."""
        states = [agent.noise_state() for agent in self.agents]
        return None if any(s is None for s in states) else torch.cat([s.reshape(-1) for s in states])

    def set_noise_state(self, state: torch.Tensor) -> None:
        """Takes back a :meth:`noise_state`."""
        shapes = [agent.noise_state().shape for agent in self.agents]
        parts = torch.split(state.reshape(-1), [math.prod(shape) for shape in shapes])
        for agent, part, shape in zip(self.agents, parts, shapes):
            agent.set_noise_state(part.reshape(shape))

    def close(self) -> None:
        """Closes the members' agents."""
        for agent in self.agents:
            agent.close()


def _rows(d: DictTensor | TemporalDictTensor, start: int, stop: int) -> Any:
    """Rows ``start:stop`` of ``d``, an empty one as it is."""
    return d.slice(start, stop) if d.variables else d


class MemberEnvs(VecEnv):
    """The auto-reset envs of several members side by side, as one :class:`~rlstruct.envs.VecEnv`: rows
    ``0, ..., n_0 - 1`` are the first env's, and so on; each step steps each env once on its rows' actions (a loop
    over the members, none over envs). For an env whose state cannot be set (:func:`create_member_envs`).

    Raises:
        ConfigError: no envs, or envs that do not auto-reset (a population collects with auto-reset envs).
    """

    def __init__(self, envs: Sequence[VecEnv]):
        self.envs = list(envs)
        if not self.envs or not all(env.autoreset for env in self.envs):
            for env in self.envs:
                env.close()
            raise ConfigError("envs must be one or more auto-reset envs (a population collects with auto-reset "
                              "envs), got " + (", ".join(f"{type(e).__name__}(autoreset={e.autoreset})"
                                                        for e in self.envs) or "none"))
        first = self.envs[0]
        self.device, self.autoreset = first.device, True
        self.action_space, self.observation_space = first.action_space, first.observation_space
        self._sizes = [env.n_envs() for env in self.envs]
        self._ids = torch.arange(sum(self._sizes), device=self.device)

    def n_envs(self) -> int:
        """Every member's envs."""
        return int(self._ids.numel())

    def reset(self, env_info: DictTensor | None = None) -> tuple[DictTensor, torch.Tensor]:
        """Resets each member's envs (``env_info``'s rows split among them)."""
        starts = [sum(self._sizes[:k]) for k in range(len(self.envs))]
        infos = [None if env_info is None or not env_info.variables else env_info.slice(a, a + n)
                 for a, n in zip(starts, self._sizes)]
        return DictTensor.cat([env.reset(info)[0] for env, info in zip(self.envs, infos)]), self._ids

    def step(self, action: DictTensor):
        """Steps each member's envs on their rows of ``action``."""
        results, start = [], 0
        for env, n in zip(self.envs, self._sizes):
            results.append(env.step(action.slice(start, start + n)))
            start += n
        nxt = DictTensor.cat([r[0][0] for r in results])
        running = DictTensor.cat([r[1][0] for r in results])
        return (nxt, self._ids), (running, self._ids)

    def close(self) -> None:
        """Closes each member's envs."""
        for env in self.envs:
            env.close()
