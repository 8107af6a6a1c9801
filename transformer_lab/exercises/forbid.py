"""Forbidden built-ins: an exercise that asks for a function written by hand makes PyTorch's own version raise
while the answer runs, whatever name, alias or import path reaches it.

    with forbidding(LOGSUMEXP):   # {ATen operator: the name a reader would have called it by}
        fn(x)                     # torch.logsumexp, x.logsumexp, torch.special.logsumexp, an alias: ForbiddenCall

The check sits at PyTorch's dispatcher (a ``TorchDispatchMode``), which every tensor operation passes through
once PyTorch has resolved aliases, methods, module forms and composite functions: ``F.cross_entropy`` arrives as
``_log_softmax`` then ``nll_loss_forward``, ``torch.distributions.Categorical(logits=z).log_prob`` as
``logsumexp``. No name is matched in the answer's source. The operators an answer written by hand uses (``amax``,
``exp``, ``sum``, ``log``, ``mean``, ``pow``) stay allowed.

:func:`forbidding` also records the set in :data:`FORBIDDEN`, so that grading can forbid the same operators in the
separate process where the student's code runs (``transformer_lab.grading``).
"""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator, Mapping

from torch.utils._python_dispatch import TorchDispatchMode

SOFTMAX = {"_softmax": "torch.softmax", "_log_softmax": "log_softmax"}
LOGSUMEXP = {"logsumexp": "torch.logsumexp", "_log_softmax": "log_softmax (x - log_softmax(x) is the log-sum-exp)"}
CROSS_ENTROPY = {"_log_softmax": "log_softmax (or F.cross_entropy, which calls it)", "logsumexp": "torch.logsumexp",
                 "nll_loss_forward": "F.nll_loss", "nll_loss2d_forward": "F.nll_loss"}
VARIANCE = {"var": "torch.var", "var_mean": "torch.var_mean", "std": "torch.std", "std_mean": "torch.std_mean"}
LAYER_NORM = {"native_layer_norm": "nn.LayerNorm / F.layer_norm", "native_group_norm": "F.group_norm",
              "native_batch_norm": "batch normalisation", "_native_batch_norm_legit": "batch normalisation",
              "_native_batch_norm_legit_no_training": "batch normalisation"}

# "trained:" forbids the operator only on a tensor that requires a gradient (a weight): building a one-hot matrix by
# indexing an identity matrix stays allowed, looking the rows up in the weight does not
LOOKUP = {f"trained:{op}": f"{name}, a lookup of weight's rows" for op, name in (
    ("index", "weight[idx]"), ("select", "weight[i]"), ("index_select", "index_select"),
    ("embedding", "F.embedding / nn.Embedding"), ("embedding_bag", "F.embedding_bag"), ("gather", "torch.gather"),
    ("take", "torch.take"), ("masked_select", "masked_select"))}

FORBIDDEN: contextvars.ContextVar[tuple[tuple[str, str], ...]] = contextvars.ContextVar("forbidden", default=())
"""The operators forbidden in the call now running, as (operator, name) pairs (none outside :func:`forbidding`)."""


class ForbiddenCall(RuntimeError):
    """An answer called an operator its exercise asks the student to write."""


class _Forbid(TorchDispatchMode):
    def __init__(self, ops: Mapping[str, str]):
        super().__init__()
        self.ops = {k: v for k, v in ops.items() if not k.startswith("trained:")}
        self.on_trained = {k.removeprefix("trained:"): v for k, v in ops.items() if k.startswith("trained:")}

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        op = func.overloadpacket.__name__
        name = self.ops.get(op)
        if name is None and op in self.on_trained and getattr(args[0] if args else None, "requires_grad", False):
            name = self.on_trained[op]
        if name is not None:
            raise ForbiddenCall(f"the answer calls {name} (PyTorch's aten.{op}), which this exercise asks "
                                "you to write yourself")
        return func(*args, **(kwargs or {}))


@contextlib.contextmanager
def forbidding(ops: Mapping[str, str] | None) -> Iterator[None]:
    """Within the block, each ATen operator named in ``ops`` raises :class:`ForbiddenCall` (none when ``ops`` is
    empty or None)."""
    token = FORBIDDEN.set(tuple((ops or {}).items()))
    try:
        if ops:
            with _Forbid(ops):
                yield
        else:
            yield
    finally:
        FORBIDDEN.reset(token)
