"""Adam for the learners: ``torch.optim.Adam``'s update through torch's functional Adam, bitwise the same parameters
and the same ``state_dict``, without the ``torch._dynamo`` import of ``torch.optim.Optimizer``
(docs/concepts/training.md).

>>> p = torch.nn.Parameter(torch.ones(2))
>>> opt = Adam([p], lr=0.1)
>>> p.sum().backward()
>>> opt.step()
>>> p.detach()
tensor([0.9000, 0.9000])
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import Any

import torch
from torch.optim.adam import adam

__all__ = ["Adam", "OptimizerLike"]


def _step_dtype(fused: bool) -> torch.dtype:
    """The dtype ``torch.optim.Adam`` keeps its step count in: float32 when fused, else the default float dtype's."""
    if fused:
        return torch.float32
    return torch.float64 if torch.get_default_dtype() == torch.float64 else torch.float32


class Adam:
    """``torch.optim.Adam(params, lr, betas, eps, weight_decay, fused=fused)`` over one group of parameters.

    Args:
        params: the tensors to optimise (each with ``requires_grad``).
        lr: learning rate (>= 0).
        betas: the moving averages' coefficients, each in [0, 1).
        eps: added to the denominator (>= 0).
        weight_decay: L2 penalty (>= 0), added to the gradient as ``torch.optim.Adam`` does.
        fused: torch's fused kernel (CPU, CUDA), as ``torch.optim.Adam``'s ``fused``; ``None`` lets torch choose
            (its multi-tensor path on CUDA, the loop on the CPU).

    Raises:
        ValueError: a setting out of its range, or no parameters.
    """

    def __init__(
        self,
        params: Iterable[torch.Tensor],
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-8,
        weight_decay: float = 0.0,
        fused: bool | None = None,
    ) -> None:
        params = list(params)
        if not params:
            raise ValueError("params must hold at least one tensor, got none; pass model.parameters()")
        if not lr >= 0.0:
            raise ValueError(f"lr must be >= 0, got {lr}")
        if not (0.0 <= betas[0] < 1.0 and 0.0 <= betas[1] < 1.0):
            raise ValueError(f"betas must each be in [0, 1), got {betas}")
        if not eps >= 0.0:
            raise ValueError(f"eps must be >= 0, got {eps}")
        if not weight_decay >= 0.0:
            raise ValueError(f"weight_decay must be >= 0, got {weight_decay}")
        # torch.optim.Adam's group keys, so that state_dict() is its format
        self.defaults: dict[str, Any] = {
            "lr": lr, "betas": tuple(betas), "eps": eps, "weight_decay": weight_decay, "amsgrad": False,
            "maximize": False, "foreach": None, "capturable": False, "differentiable": False, "fused": fused,
            "decoupled_weight_decay": False,
        }
        self.param_groups: list[dict[str, Any]] = [{**self.defaults, "params": params}]
        self.state: defaultdict[torch.Tensor, dict[str, torch.Tensor]] = defaultdict(dict)

    def __repr__(self) -> str:
        group = {k: v for k, v in self.param_groups[0].items() if k != "params"}
        return f"Adam({len(self.param_groups[0]['params'])} tensors, {group})"

    @torch.no_grad()
    def step(self) -> None:
        """One Adam step over the parameters that have a gradient."""
        for group in self.param_groups:
            fused = bool(group["fused"])
            params, grads, exp_avgs, exp_avg_sqs, steps = [], [], [], [], []
            for p in group["params"]:
                if p.grad is None:
                    continue
                state = self.state[p]
                if not state:  # torch.optim.Adam's lazy initialisation: the count on the device when fused
                    state["step"] = torch.zeros((), dtype=_step_dtype(fused), device=p.device if fused else "cpu")
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                params.append(p)
                grads.append(p.grad)
                exp_avgs.append(state["exp_avg"])
                exp_avg_sqs.append(state["exp_avg_sq"])
                steps.append(state["step"])
            if not params:
                continue
            beta1, beta2 = group["betas"]
            adam(params, grads, exp_avgs, exp_avg_sqs, [], steps, foreach=group["foreach"], fused=group["fused"],
                 has_complex=any(torch.is_complex(p) for p in params), amsgrad=False, beta1=beta1, beta2=beta2,
                 lr=group["lr"], weight_decay=group["weight_decay"], eps=group["eps"], maximize=False)

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Drops the gradients (``set_to_none``) or zeroes them in place."""
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    if p.grad.grad_fn is not None:
                        p.grad.detach_()
                    else:
                        p.grad.requires_grad_(False)
                    p.grad.zero_()

    def state_dict(self) -> dict[str, Any]:
        """``torch.optim.Adam``'s ``state_dict``: the state by parameter index, the groups with their indices."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            start = len(index)
            index.update({id(p): start + i for i, p in enumerate(group["params"]) if id(p) not in index})
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": [index[id(p)] for p in group["params"]]})
        state = {index[id(p)]: s for p, s in self.state.items()}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """Loads a state dict of this class or of ``torch.optim.Adam`` over the same parameters.

        The moments take their parameter's dtype and device; the step count stays on the CPU unless the group is
        fused (as ``torch.optim.Adam`` does).

        Raises:
            ValueError: another number of groups, or of parameters in a group.
        """
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups):
            raise ValueError(f"the state dict has {len(saved)} parameter groups, this optimizer "
                             f"{len(self.param_groups)}; load the state of an optimizer over the same model")
        by_index: dict[int, torch.Tensor] = {}
        for mine, theirs in zip(self.param_groups, saved, strict=True):
            if len(mine["params"]) != len(theirs["params"]):
                raise ValueError(f"a parameter group of the state dict has {len(theirs['params'])} tensors, this "
                                 f"optimizer's {len(mine['params'])}; load the state of an optimizer over the same "
                                 f"model")
            by_index.update(zip(theirs["params"], mine["params"], strict=True))
        groups = [{**{k: v for k, v in theirs.items() if k != "params"}, "params": mine["params"]}
                  for mine, theirs in zip(self.param_groups, saved, strict=True)]
        fused = {id(p): bool(g.get("fused")) for g in groups for p in g["params"]}
        state: defaultdict[torch.Tensor, dict[str, torch.Tensor]] = defaultdict(dict)
        for k, s in state_dict["state"].items():
            p = by_index[k]
            state[p] = {
                name: (v.to(dtype=torch.float32, device=p.device) if fused[id(p)] else v) if name == "step"
                else v.to(dtype=p.dtype, device=p.device) if p.is_floating_point() else v.to(device=p.device)
                for name, v in s.items()
            }
        self.param_groups = groups
        self.state = state


#: what the learners' loops and checkpoints take: this module's Adam or any torch optimizer
OptimizerLike = Adam | torch.optim.Optimizer
