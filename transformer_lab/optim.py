"""AdamW and the warm-up + cosine learning-rate schedule (chapter 3, optimization).

AdamW (Kingma & Ba's Adam with Loshchilov & Hutter's decoupled weight decay), for each parameter θ with
gradient g at step t = 1, 2, ...::

    θ ← θ (1 − η λ)                          decoupled weight decay
    m ← β₁ m + (1 − β₁) g                    first moment (moving average of g)
    v ← β₂ v + (1 − β₂) g²                   second moment (moving average of g²)
    m̂ = m / (1 − β₁ᵗ),  v̂ = v / (1 − β₂ᵗ)   bias correction (chapter 3 derives it)
    θ ← θ − η m̂ / (√v̂ + ε)

It is a :class:`torch.optim.Optimizer`, so ``state_dict()`` / ``load_state_dict()`` work; per-parameter state
is ``step`` (an int), ``exp_avg`` (m) and ``exp_avg_sq`` (v). The update runs tensor by tensor, the formulas above
line by line. Which tensors decay is chosen by the parameter groups (:func:`decay_groups` puts those with two or
more dimensions in the decayed one); ``AdamW`` applies each group's ``weight_decay`` as given.
The trainer uses :class:`transformer_lab.fast.FastAdamW`: the same update in fewer passes over memory.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass

import torch
from torch import nn


def _check_hyper(lr, betas, eps, weight_decay) -> None:
    if not (isinstance(lr, int | float) and math.isfinite(lr) and lr > 0):
        raise ValueError(f"learning rate must be a finite number > 0, got lr={lr!r}")
    if not (isinstance(betas, tuple | list) and len(betas) == 2):
        raise ValueError(f"betas must be a pair (beta1, beta2), got {betas!r}")
    for i, b in enumerate(betas):
        if not (isinstance(b, int | float) and 0.0 <= b < 1.0):
            raise ValueError(f"betas[{i}] must lie in [0, 1), got {b!r}")
    if not (isinstance(eps, int | float) and math.isfinite(eps) and eps > 0):
        raise ValueError(f"eps must be a finite number > 0, got eps={eps!r}")
    if not (isinstance(weight_decay, int | float) and math.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"weight_decay must be a finite number >= 0, got weight_decay={weight_decay!r}")


class AdamW(torch.optim.Optimizer):
    """Adam with bias correction and decoupled weight decay; same update as ``torch.optim.AdamW``.

    ``params``: an iterable of tensors or of parameter-group dicts (see :func:`decay_groups`).
    ``check_finite``: raise ``ValueError`` when a gradient entry is NaN or ±inf (one max-|g| reduction per tensor
    per step; an L2 norm would overflow to inf on large finite entries, e.g. float16 gradients of 10⁴).
    """

    def __init__(self, params, lr: float = 1e-3, betas: tuple[float, float] = (0.9, 0.999), eps: float = 1e-8,
                 weight_decay: float = 0.01, *, check_finite: bool = True):
        _check_hyper(lr, betas, eps, weight_decay)
        self.check_finite = check_finite
        super().__init__(params, dict(lr=lr, betas=tuple(betas), eps=eps, weight_decay=weight_decay))

    def __getstate__(self) -> dict:
        """What a copy or a pickle keeps: torch.optim's defaults, state and groups, and ``check_finite``."""
        return {**super().__getstate__(), "check_finite": self.check_finite}

    def add_param_group(self, param_group: dict) -> None:
        g = {**self.defaults, **param_group}
        _check_hyper(g["lr"], g["betas"], g["eps"], g["weight_decay"])
        super().add_param_group(param_group)

    @torch.no_grad()
    def step(self, closure=None):
        """One AdamW update of every parameter that has a gradient; returns ``closure()`` if given.

        Every group is validated first (learning rate, gradient shapes and, with ``check_finite``, finiteness):
        when one check fails, no parameter, moment or step counter of any group has changed.
        """
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        work = [(group, self._with_grad(group)) for group in self.param_groups]  # validate everything first
        if self.check_finite:
            self._check_finite([p for _, params in work for p in params])
        for i, (group, params) in enumerate(work):  # then update, group by group
            self._step_group(i, group, params)
        return loss

    def _step_group(self, i: int, group: dict, params: list[torch.Tensor]) -> None:
        """Update the parameters ``params`` of group ``i`` (those with a gradient), one tensor at a time."""
        for p in params:
            state = self._advance(p)
            self._update(p, p.grad, state["exp_avg"], state["exp_avg_sq"], state["step"], group)

    def _advance(self, p: torch.Tensor) -> dict:
        """p's state with its step count t ← t + 1; m = v = 0 at the first step."""
        state = self.state[p]
        if not state:
            state["step"] = 0
            state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
            state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
        state["step"] = int(state["step"]) + 1  # t ← t + 1 (a torch AdamW state holds a tensor)
        return state

    def _with_grad(self, group: dict) -> list[torch.Tensor]:
        """The parameters of ``group`` that have a gradient, after checking the group's lr and their shapes
        (changes nothing)."""
        lr = group["lr"]
        if not (math.isfinite(lr) and lr >= 0):  # a schedule may set lr = 0 at its end, never below
            raise ValueError(f"learning rate must be finite and >= 0 during training, got {lr!r}")
        params = []
        for p in group["params"]:
            if p.grad is None:
                continue
            if p.grad.is_sparse:
                raise ValueError("AdamW does not support sparse gradients")
            if p.grad.shape != p.shape:
                raise ValueError(f"gradient shape {tuple(p.grad.shape)} does not match parameter shape "
                                 f"{tuple(p.shape)}")
            for key in ("exp_avg", "exp_avg_sq"):
                if key in self.state.get(p, {}) and self.state[p][key].shape != p.shape:
                    raise ValueError(f"state {key!r} has shape {tuple(self.state[p][key].shape)}, parameter has "
                                     f"{tuple(p.shape)} (a state_dict from another model?)")
            params.append(p)
        return params

    @staticmethod
    def _check_finite(params) -> None:
        if not params:
            return
        # max |g| per tensor: NaN if an entry is NaN, inf if one is ±inf, finite otherwise (never overflows, unlike
        # the L2 norm); stack promotes dtypes
        params = [p for p in params if p.numel() > 0]  # the inf-norm of an empty tensor raises
        if not params:
            return
        norms = torch.stack(torch._foreach_norm([p.grad for p in params], ord=float("inf")))
        if not torch.isfinite(norms).all():
            i = int((~torch.isfinite(norms)).nonzero()[0])
            raise ValueError(f"non-finite gradient (NaN or inf) in parameter of shape {tuple(params[i].shape)}; "
                             "lower the learning rate or check the loss")

    @staticmethod
    def _update(param, grad, m, v, t: int, group: dict) -> None:
        """One AdamW step of one tensor ``param`` with gradient ``grad``, moments ``m``, ``v`` (in place), step t."""
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        param.mul_(1 - lr * wd)  # θ ← θ(1 − ηλ)
        m.lerp_(grad, 1 - beta1)  # m ← β₁ m + (1 − β₁) g
        v.mul_(beta2).addcmul_(grad, grad, value=1 - beta2)  # v ← β₂ v + (1 − β₂) g²
        denom = (v.sqrt() / math.sqrt(1 - beta2**t)).add_(eps)  # √v̂ + ε, with v̂ = v / (1 − β₂ᵗ)
        param.addcdiv_(m, denom, value=-lr / (1 - beta1**t))  # θ ← θ − η m̂ / (√v̂ + ε), with m̂ = m / (1 − β₁ᵗ)

    def load_state_dict(self, state_dict: dict) -> None:
        """Load a state saved by this class or by ``torch.optim.AdamW`` (its tensor ``step`` becomes an int).

        A ``torch.optim.AdamW`` state with ``maximize`` or ``amsgrad`` set is refused: this class implements
        neither, and would silently take different steps."""
        for group in state_dict.get("param_groups", []):
            for flag in ("maximize", "amsgrad"):
                if group.get(flag):
                    raise ValueError(f"cannot load a state with {flag}=True: this AdamW implements plain AdamW "
                                     f"(no {flag})")
        super().load_state_dict(state_dict)
        for state in self.state.values():
            if "step" in state:
                state["step"] = int(state["step"])


def decay_groups(model: nn.Module, weight_decay: float) -> list[dict]:
    """Two parameter groups: tensors with ``dim >= 2`` (matrices, embeddings) decay; the rest do not.

    Biases and LayerNorm weights are 1-D, so they are not pulled towards zero. Shared (tied) parameters
    appear once. Returns ``[{"params": decay, "weight_decay": weight_decay}, {"params": rest, "weight_decay": 0}]``.
    """
    if not (isinstance(weight_decay, int | float) and math.isfinite(weight_decay) and weight_decay >= 0):
        raise ValueError(f"weight_decay must be a finite number >= 0, got {weight_decay!r}")
    params = [p for _, p in model.named_parameters() if p.requires_grad]
    if not params:
        raise ValueError("the model has no trainable parameters")
    decay = [p for p in params if p.dim() >= 2]
    rest = [p for p in params if p.dim() < 2]
    return [{"params": decay, "weight_decay": float(weight_decay)}, {"params": rest, "weight_decay": 0.0}]


@dataclass(frozen=True)
class WarmupCosine:
    """Linear warm-up to ``max_lr``, then cosine decay to ``min_lr`` at step ``total``, then constant.

    η(s) = max_lr (s + 1) / warmup                                   for 0 <= s < warmup
    η(s) = min_lr + ½ (max_lr − min_lr) (1 + cos(π (s − warmup) / (total − warmup)))   for warmup <= s <= total
    η(s) = min_lr                                                    for s > total
    """

    max_lr: float  # peak learning rate: reached at step `warmup` − 1 and held at step `warmup`
    min_lr: float  # floor of the cosine, 0 <= min_lr <= max_lr
    warmup: int  # number of warm-up steps (0: start at max_lr)
    total: int  # step at which the cosine reaches min_lr (> warmup)

    def __post_init__(self):
        if not (math.isfinite(self.max_lr) and self.max_lr > 0):
            raise ValueError(f"max_lr must be a finite number > 0, got {self.max_lr!r}")
        if not (math.isfinite(self.min_lr) and 0 <= self.min_lr <= self.max_lr):
            raise ValueError(f"min_lr must lie in [0, max_lr={self.max_lr}], got {self.min_lr!r}")
        if not (isinstance(self.warmup, int) and self.warmup >= 0):
            raise ValueError(f"warmup must be an int >= 0, got {self.warmup!r}")
        if not (isinstance(self.total, int) and self.total > self.warmup):
            raise ValueError(f"total must be an int > warmup={self.warmup}, got {self.total!r}")

    def __call__(self, step: int) -> float:
        if isinstance(step, bool) or not isinstance(step, numbers.Integral) or step < 0:
            raise ValueError(f"step must be an int >= 0, got {step!r}")
        step = int(step)  # a NumPy integer too
        if step < self.warmup:
            return self.max_lr * (step + 1) / self.warmup  # linear ramp: η_max (s+1)/w
        if step > self.total:
            return self.min_lr
        progress = (step - self.warmup) / (self.total - self.warmup)  # in [0, 1]
        return self.min_lr + 0.5 * (self.max_lr - self.min_lr) * (1 + math.cos(math.pi * progress))

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Set every group's ``lr`` to ``self(step)`` and return it."""
        lr = self(step)
        for group in optimizer.param_groups:
            group["lr"] = lr
        return lr
