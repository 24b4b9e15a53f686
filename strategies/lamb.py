"""LAMB with torch_optimizer.Lamb's exact semantics (torch-optimizer 0.3.0, every party's optimiser before this one),
as multi-tensor ``torch._foreach_*`` ops and without a host synchronisation per step.

torch_optimizer.Lamb loops over the parameters in Python and reads each norm back to the host
(``weight_norm == 0``, a tensor ``alpha``); on a GPU that makes the step host-bound. This one
computes the same update for all parameters of a (device, dtype) at once, and the zero-norm cases
with ``torch.where``. Per parameter with a gradient, step t (p, g, m, v of the parameter's shape):

    m = beta1 m + (1 - beta1) g;  v = beta2 v + (1 - beta2) g^2
    u = m / (sqrt(v) + eps) + weight_decay p
    w = clamp(||p||, 0, clamp_value);  a = ||u||;  r = 1 if w == 0 or a == 0 else w / a  (1 if adam)
    p = p - (lr c_t r) u,  c_t = sqrt(1 - beta2^t) / (1 - beta1^t) if debias else 1

The state layout is torch_optimizer's (per parameter: ``step`` an int, ``exp_avg``, ``exp_avg_sq``;
the hyperparameters in the groups, ``clamp_value`` / ``adam`` / ``debias`` on the optimiser), so its
checkpoints load into this one and back. It does not keep torch_optimizer's diagnostics
(``weight_norm``, ``adam_norm``, ``trust_ratio``): nothing reads them, and they are dropped on load.
"""

from __future__ import annotations

import math

import torch
from torch.optim.optimizer import Optimizer

DIAGNOSTICS = ("weight_norm", "adam_norm", "trust_ratio")  # torch_optimizer's; not kept


def trust_ratio(w_norm: torch.Tensor, a_norm: torch.Tensor) -> torch.Tensor:
    """(N,) clamped weight norms, (N,) Adam-step norms -> (N,) w / a, and 1 where either is zero."""
    return torch.where((w_norm == 0) | (a_norm == 0), 1.0, w_norm / a_norm)


class EagerOptimizer(Optimizer):
    """torch's Optimizer with its own methods unwrapped (functools.wraps' ``__wrapped__``): torch
    wraps these in torch._disable_dynamo, whose first call imports torch's compiler (torch._dynamo,
    ~1.1 s of CPU) in every process that builds an optimiser. Nothing compiles an optimiser here.
    The base of LAMB and of Entity Augmentation's Adam (strategies/optim.py)."""

    add_param_group = Optimizer.add_param_group.__wrapped__
    zero_grad = Optimizer.zero_grad.__wrapped__
    state_dict = Optimizer.state_dict.__wrapped__
    load_state_dict = Optimizer.load_state_dict.__wrapped__


class Lamb(EagerOptimizer):
    """torch_optimizer.Lamb's arguments, defaults and checks (eps 1e-6, no debiasing, clamp 10)."""

    def __init__(
        self,
        params,
        lr: float = 1e-3,
        betas: tuple[float, float] = (0.9, 0.999),
        eps: float = 1e-6,
        weight_decay: float = 0,
        clamp_value: float = 10,
        adam: bool = False,
        debias: bool = False,
    ) -> None:
        if lr <= 0.0:
            raise ValueError(f"Invalid learning rate: {lr}")
        if eps < 0.0:
            raise ValueError(f"Invalid epsilon value: {eps}")
        for i in (0, 1):
            if not 0.0 <= betas[i] < 1.0:
                raise ValueError(f"Invalid beta parameter at index {i}: {betas[i]}")
        if weight_decay < 0:
            raise ValueError(f"Invalid weight_decay value: {weight_decay}")
        if clamp_value < 0.0:
            raise ValueError(f"Invalid clamp value: {clamp_value}")
        self.clamp_value, self.adam, self.debias = clamp_value, adam, debias
        super().__init__(params, dict(lr=lr, betas=betas, eps=eps, weight_decay=weight_decay))

    @torch.no_grad()
    def step(self, closure=None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            for params, grads, avgs, sqs, steps in self._gather(group).values():
                self._update(group, params, grads, avgs, sqs, self._step_sizes(group, steps))
        return loss

    def _gather(self, group: dict) -> dict:
        """The group's parameters with a gradient, per (device, dtype): lists of the parameters,
        gradients, first and second moments, and their step counts (advanced here, host ints)."""
        out: dict[tuple, tuple[list, ...]] = {}
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise RuntimeError("Lamb does not support sparse gradients, please consider SparseAdam instead")
            state = self.state[p]
            if len(state) == 0:
                state["step"] = 0
                state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["step"] += 1
            lists = out.setdefault((p.device, p.dtype), ([], [], [], [], []))
            for lst, item in zip(lists, (p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"])):
                lst.append(item)
        return out

    def _step_sizes(self, group: dict, steps: list[int]) -> list[float]:
        """lr, times the bias correction when debiasing (torch_optimizer's arithmetic, per parameter)."""
        if not self.debias:
            return [group["lr"]] * len(steps)
        beta1, beta2 = group["betas"]
        return [group["lr"] * (math.sqrt(1 - beta2**t) / (1 - beta1**t)) for t in steps]

    def _update(self, group: dict, params: list, grads: list, avgs: list, sqs: list, sizes: list[float]) -> None:
        """One LAMB step for N same-device, same-dtype parameters; nothing is read back to the host."""
        beta1, beta2 = group["betas"]
        torch._foreach_lerp_(avgs, grads, 1 - beta1)  # m_t = beta1 m + (1 - beta1) g, one pass
        torch._foreach_mul_(sqs, beta2)
        torch._foreach_addcmul_(sqs, grads, grads, value=1 - beta2)  # v_t
        w_norm = torch.stack(torch._foreach_norm(params)).clamp(0, self.clamp_value)  # (N,)
        denom = torch._foreach_sqrt(sqs)
        torch._foreach_add_(denom, group["eps"])
        upd = torch._foreach_div(avgs, denom)  # the Adam step, each its parameter's shape
        if group["weight_decay"] != 0:
            torch._foreach_add_(upd, params, alpha=group["weight_decay"])
        a_norm = torch.stack(torch._foreach_norm(upd))  # (N,)
        trust = torch.ones_like(w_norm) if self.adam else trust_ratio(w_norm, a_norm)  # (N,)
        alphas = torch._foreach_mul(list(trust.unbind()), [-s for s in sizes])  # N 0-dim: -step_size * r
        torch._foreach_addcmul_(params, upd, alphas)  # p += alpha u, one pass

    def load_state_dict(self, state_dict: dict) -> None:
        """Also torch_optimizer.Lamb's: its diagnostics are dropped, a tensor step becomes an int."""
        super().load_state_dict(state_dict)
        for state in self.state.values():
            for key in DIAGNOSTICS:
                state.pop(key, None)
            if torch.is_tensor(state.get("step")):
                state["step"] = int(state["step"].item())
