"""AdamW and the warm-up + cosine learning-rate schedule (chapter 3, optimization).

AdamW (Kingma & Ba's Adam with Loshchilov & Hutter's decoupled weight decay), for each parameter θ with
gradient g at step t = 1, 2, ...::

    θ ← θ (1 − η λ)                          decoupled weight decay
    m ← β₁ m + (1 − β₁) g                    first moment (moving average of g)
    v ← β₂ v + (1 − β₂) g²                   second moment (moving average of g²)
    m̂ = m / (1 − β₁ᵗ),  v̂ = v / (1 − β₂ᵗ)   bias correction (chapter 3 derives it)
    θ ← θ − η m̂ / (√v̂ + ε)

It is a :class:`torch.optim.Optimizer`, so ``state_dict()`` / ``load_state_dict()`` work; per-parameter state
is ``step`` (an int), ``exp_avg`` (m) and ``exp_avg_sq`` (v). The update runs with ``torch._foreach_*`` ops
over the tensors of a group (no Python loop over elements), in chunks of at most ``_CHUNK`` numbers (a larger
tensor is a chunk of its own), meant to keep a chunk's tensors in the CPU's cache through all eight ``_foreach``
operations (seven without decay); the chunk size is not tuned. Which tensors decay is chosen by the parameter
groups (:func:`decay_groups` puts those with two or more dimensions in the decayed one); ``AdamW`` applies each
group's ``weight_decay`` as given.

:meth:`AdamW.flatten_` (the trainer calls it) lays each group's parameters, gradients and moments out in one
contiguous tensor apiece, the parameters becoming views into it: the same update, element by element, in eight
operations per group instead of eight per tensor (on a CPU, ``_foreach_*`` runs tensor by tensor).
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

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


_CHUNK = 1 << 16  # numbers per _update call: 64 Ki, so θ, g, m, v and √v̂ + ε take 5 × 64 Ki × 4 B = 1.25 MiB in float32


def _chunks(params: list[torch.Tensor], size: int = _CHUNK) -> list[slice]:
    """Consecutive runs of ``params`` holding at most ``size`` numbers together (a larger tensor runs alone)."""
    out, start, n = [], 0, 0
    for i, p in enumerate(params):
        if n and n + p.numel() > size:
            out.append(slice(start, i))
            start, n = i, 0
        n += p.numel()
    return [*out, slice(start, len(params))] if params else out


def _flat_update(param, grad, exp_avg, exp_avg_sq, hyper) -> None:
    """:meth:`AdamW._update` for one tensor, written for ``torch.compile``: the hyperparameters come in one
    tensor (so a new learning rate or step does not compile again), ``hyper`` = (ηλ, 1 − β₁, β₂, ε,
    −η / (1 − β₁ᵗ), √(1 − β₂ᵗ)). Compiled with ``dynamic=False``: one graph per flat-tensor length, shared by every
    optimizer in the process (more than torch._dynamo's recompile limit of such lengths would run eagerly)."""
    decay, one_minus_beta1, beta2, eps, step_size, bc2_sqrt = hyper.unbind()
    param.mul_(1 - decay)  # θ ← θ(1 − ηλ)
    exp_avg.lerp_(grad, one_minus_beta1)  # m ← β₁ m + (1 − β₁) g
    exp_avg_sq.mul_(beta2).add_((1 - beta2) * grad * grad)  # v ← β₂ v + (1 − β₂) g²
    param.add_(step_size * exp_avg / (exp_avg_sq.sqrt() / bc2_sqrt + eps))  # θ ← θ − η m̂ / (√v̂ + ε)


def _flat_clip(grads: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` over the flat gradient tensors (one per group), written for
    ``torch.compile``: ‖g‖ = torch's ``get_total_norm`` (the L2 norm of the tensors' L2 norms), then every gradient
    times min(1, max_norm / (‖g‖ + 1e-6)). Returns ‖g‖ (NaN or inf when a gradient is not finite). Compiled like
    :func:`_flat_update`: one graph per set of flat-tensor lengths."""
    norm = torch.nn.utils.get_total_norm(grads)
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)
    for g in grads:
        g.mul_(coef)
    return norm


@dataclass(eq=False)
class _FlatGroup:
    """A flattened group's tensors, each (n,): the group's numbers, each parameter's starting on a 64-byte boundary
    (n counts the zero padding between them), and the views handed out of them."""

    param: torch.Tensor
    grad: torch.Tensor
    exp_avg: torch.Tensor
    exp_avg_sq: torch.Tensor
    views: list = field(default_factory=list)  # per parameter: (it, its data_ptr, its gradient, its m, its v)


class AdamW(torch.optim.Optimizer):
    """Adam with bias correction and decoupled weight decay; same update as ``torch.optim.AdamW``.

    ``params``: an iterable of tensors or of parameter-group dicts (see :func:`decay_groups`).
    ``check_finite``: raise ``ValueError`` when a gradient entry is NaN or ±inf (one max-|g| reduction per tensor
    per step; an L2 norm would overflow to inf on large finite entries, e.g. float16 gradients of 10⁴).
    """

    # set per optimizer by flatten_(); class defaults for a copy (torch.optim's __getstate__ keeps only the state)
    _flat: list[_FlatGroup | None] | None = None  # one per group
    _kernel = None  # _flat_update compiled, with flatten_(compile=True)
    _clip = None  # _flat_clip compiled, with flatten_(compile=True)

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
            flat = self._intact(i)  # then every parameter of the group has its gradient view: none left out
            if flat is not None:
                state = self.state.get(params[0])
                t = (state["step"] if state else 0) + 1  # flatten_ checked that the group's steps agree
                for p, _, _, m, v in flat.views:
                    self.state[p].update(step=t, exp_avg=m, exp_avg_sq=v)
                if self._kernel is None:
                    self._update([flat.param], [flat.grad], [flat.exp_avg], [flat.exp_avg_sq], [t], group)
                else:
                    (beta1, beta2), lr = group["betas"], group["lr"]
                    hyper = torch.tensor([lr * group["weight_decay"], 1 - beta1, beta2, group["eps"],
                                          -lr / (1 - beta1**t), math.sqrt(1 - beta2**t)],
                                         dtype=torch.promote_types(flat.param.dtype, torch.float32))
                    self._kernel(flat.param, flat.grad, flat.exp_avg, flat.exp_avg_sq, hyper.to(flat.param.device))
                continue
            steps = []
            for p in params:
                state = self.state[p]
                if not state:
                    state["step"] = 0
                    state["exp_avg"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    state["exp_avg_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                state["step"] = int(state["step"]) + 1  # t ← t + 1 (a torch AdamW state holds a tensor)
                steps.append(state["step"])
            grads = [p.grad for p in params]
            ms = [self.state[p]["exp_avg"] for p in params]
            vs = [self.state[p]["exp_avg_sq"] for p in params]
            for c in _chunks(params):  # the same arithmetic as one call, without cache misses between ops
                self._update(params[c], grads[c], ms[c], vs[c], steps[c], group)
        return loss

    def flatten_(self, *, compile: bool = False) -> None:
        """Give each group one contiguous tensor for its parameters, one for their gradients and one for each
        moment; every parameter, gradient and moment becomes a view into them (values kept), so a step updates a
        group in eight operations instead of eight per tensor. A group is left as it is when its parameters differ
        in dtype or device, when one is not contiguous or does not require a gradient, or when their loaded states
        took different numbers of steps. A loaded moment of the wrong shape raises ``ValueError``.

        Afterwards :meth:`zero_grad` fills those gradients with zeros (it never sets them to ``None``: the views
        would be lost), so every parameter of a flattened group is updated at every step, as in a model that uses
        all its parameters in every forward pass. Moving the parameters (``model.to``) or replacing a gradient
        ends the flat layout of that group: the step then falls back to the per-tensor update. A loaded state is
        flattened again (:meth:`load_state_dict`).

        ``compile=True`` (the trainer's default when it compiles the model) runs a flat group's update through
        ``torch.compile`` (:func:`_flat_update`): one generated kernel instead of eight passes over the tensors,
        compiled once for all steps and learning rates; equal to the eager update up to float round-off. It also
        compiles :meth:`clip_grad_norm_` over the flat gradients."""
        self._flat = [self._flatten_group(g["params"]) for g in self.param_groups]
        if compile and self._kernel is None:
            # not fullgraph: past torch._dynamo's recompile limit of shapes, a call runs eagerly instead of failing
            self._kernel = torch.compile(_flat_update, dynamic=False)
            self._clip = torch.compile(_flat_clip, dynamic=False)

    def clip_grad_norm_(self, params, max_norm: float) -> torch.Tensor:
        """``torch.nn.utils.clip_grad_norm_(params, max_norm)``: scale the gradients of ``params`` by
        min(1, max_norm / (‖g‖ + 1e-6)), ‖g‖ the L2 norm of all of them together; returns ‖g‖ (a 0-dim tensor).

        After ``flatten_(compile=True)``, when ``params`` are exactly this optimizer's parameters and every group
        is flat, one compiled kernel (:func:`_flat_clip`) does it over the flat gradients (two passes: the norm, then
        the scaling) instead of passes per tensor: the same formula, equal up to float round-off (the squares are
        summed in another order).
        Otherwise it is torch's function, bit for bit."""
        params = list(params)
        flats = None if self._clip is None else self._all_flat(params)
        if flats is None:
            return torch.nn.utils.clip_grad_norm_(params, max_norm)
        return self._clip([f.grad for f in flats], float(max_norm))

    def _all_flat(self, params: list[torch.Tensor]) -> list[_FlatGroup] | None:
        """Every group's flat tensors, if every group is intact and ``params`` are exactly the groups' parameters,
        each once (in any order)."""
        flats = [self._intact(i) for i in range(len(self.param_groups))]
        given = {id(p) for p in params}
        if None in flats or len(given) != len(params) or given != {id(p) for g in self.param_groups
                                                                   for p in g["params"]}:
            return None
        return flats

    def _flatten_group(self, params: list[torch.Tensor]) -> _FlatGroup | None:
        states = [self.state.get(p) for p in params]
        for p, state in zip(params, states, strict=True):
            for key in ("exp_avg", "exp_avg_sq") if state else ():
                if state[key].shape != p.shape:
                    raise ValueError(f"state {key!r} has shape {tuple(state[key].shape)}, parameter has "
                                     f"{tuple(p.shape)} (a state_dict from another model?)")
        if (not params or len({(p.dtype, p.device) for p in params}) > 1
                or not all(p.is_contiguous() and p.requires_grad for p in params)
                or len({state["step"] if state else None for state in states}) > 1):
            return None  # left as it is, updated tensor by tensor (checked before anything is moved)
        first = params[0]
        align = max(1, 64 // first.element_size())  # each view starts on a 64-byte boundary, as a tensor of its own
        starts, n = [], 0
        for p in params:
            starts.append(n)
            n += -(-p.numel() // align) * align
        # the padding between views stays 0 in all four tensors: its update is 0
        flat = _FlatGroup(*(torch.zeros(n, dtype=first.dtype, device=first.device) for _ in range(4)))
        for p, state, start in zip(params, states, starts, strict=True):
            part = slice(start, start + p.numel())  # p's numbers in each flat tensor
            view = [t[part].view_as(p) for t in (flat.param, flat.grad, flat.exp_avg, flat.exp_avg_sq)]
            view[0].copy_(p.detach())
            p.data = view[0]
            if p.grad is not None:
                view[1].copy_(p.grad)
            p.grad = view[1]
            if state:  # moments from earlier steps or a loaded state; a new state gets the views at its first step
                view[2].copy_(state["exp_avg"])
                view[3].copy_(state["exp_avg_sq"])
                state.update(exp_avg=view[2], exp_avg_sq=view[3])
            flat.views.append((p, p.data_ptr(), *view[1:]))
        return flat

    def _intact(self, i: int) -> _FlatGroup | None:
        """Group i's flat tensors if every parameter, gradient and moment of the group is still a view of them."""
        flat = None if self._flat is None or i >= len(self._flat) else self._flat[i]
        if flat is None or len(self.param_groups[i]["params"]) != len(flat.views):
            return None
        for p, (q, ptr, g, m, v) in zip(self.param_groups[i]["params"], flat.views, strict=True):
            state = self.state.get(p)
            if p is not q or not p.requires_grad or p.data_ptr() != ptr or p.grad is not g or (state and (
                    state["exp_avg"] is not m or state["exp_avg_sq"] is not v)):
                return None
        return flat

    def zero_grad(self, set_to_none: bool = True) -> None:
        """Zero the gradients: a flattened group's with one fill (kept as views), the others as ``torch.optim``
        does (set to ``None``, or zeroed in place with ``set_to_none=False``)."""
        for i, group in enumerate(self.param_groups):
            flat = self._intact(i)
            if flat is not None:
                flat.grad.zero_()
                continue
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                    continue
                if p.grad.grad_fn is not None:
                    p.grad.detach_()
                else:
                    p.grad.requires_grad_(False)
                p.grad.zero_()

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
    def _update(params, grads, ms, vs, steps, group) -> None:
        lr, (beta1, beta2), eps, wd = group["lr"], group["betas"], group["eps"], group["weight_decay"]
        if wd != 0:
            torch._foreach_mul_(params, 1 - lr * wd)  # θ ← θ(1 − ηλ)
        torch._foreach_lerp_(ms, grads, 1 - beta1)  # m ← β₁ m + (1 − β₁) g
        torch._foreach_mul_(vs, beta2)
        torch._foreach_addcmul_(vs, grads, grads, value=1 - beta2)  # v ← β₂ v + (1 − β₂) g²
        step_sizes = [-lr / (1 - beta1**t) for t in steps]  # −η / (1 − β₁ᵗ)
        bc2_sqrt = [math.sqrt(1 - beta2**t) for t in steps]  # √(1 − β₂ᵗ)
        denom = torch._foreach_sqrt(vs)
        torch._foreach_div_(denom, bc2_sqrt)
        torch._foreach_add_(denom, eps)  # √v̂ + ε
        torch._foreach_addcdiv_(params, ms, denom, step_sizes)  # θ ← θ − η m̂ / (√v̂ + ε)

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
        if self._flat is not None:  # the loaded moments are new tensors: into the flat layout with them
            self.flatten_()


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
