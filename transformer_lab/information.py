"""Information theory (chapter 5): entropy, cross-entropy, KL divergence, perplexity, bits per character.

All quantities are in **nats** (natural logarithms), the unit of the training loss, except where a function's
name says bits: ``bits_per_char`` and the n-gram estimates ending in ``_bits`` return bits per character, the unit
of the literature on the entropy of text. Each n-gram function names its unit.
Distributions live on the last dimension by default; ``0 · log 0 = 0`` throughout (``torch.special.xlogy``).

* ``entropy(p)``                      H(p)     = -Σ_i p_i log p_i
* ``distribution_cross_entropy(p, q)`` H(p, q) = -Σ_i p_i log q_i  = H(p) + KL(p ‖ q)
* ``kl_divergence(p, q)``             KL(p‖q)  =  Σ_i p_i log(p_i / q_i) ≥ 0   (Gibbs' inequality)
* ``mutual_information(joint)``       I(X; Y)  = KL(p(x, y) ‖ p(x) p(y)) = H(Y) - H(Y | X)
* ``cross_entropy(logits, targets)``  the training loss: mean over tokens of  log Σ_j e^{z_j} - z_y
* ``ngram_entropy_bits(text, n)``     plug-in H(X_t | X_{t-n+1} … X_{t-1}) of a text's characters, bits per character
* ``ngram_counts(train, test, n)``    c(h x) and c(h) in ``train`` for every n-gram h x of ``test``
* ``ngram_cross_entropy_bits(train, test, n, alpha=…)``  held-out bits/char of an add-α smoothed n-gram model
* ``ngram_baselines_nats(text, orders, held_out=…)``  held-out nats/char of interpolated Kneser–Ney n-gram models
  (:class:`KneserNey`): the baselines a language model should beat
"""

from __future__ import annotations

import math
import numbers

import numpy as np
import torch

LN2 = math.log(2.0)
"""ln 2: divide nats by it to get bits."""

_REDUCTIONS = ("mean", "sum", "none")


# ---------------------------------------------------------------- validation
def _check_distribution(p: torch.Tensor, name: str, dim: int, *, atol: float = 1e-6) -> None:
    """Raise ValueError unless ``p`` is a floating tensor of probabilities summing to 1 along ``dim``."""
    if not isinstance(p, torch.Tensor):
        raise ValueError(f"{name} must be a torch.Tensor, got {type(p).__name__}")
    if not p.is_floating_point():
        raise ValueError(f"{name} must be a floating-point tensor of probabilities, got dtype {p.dtype}")
    if p.dim() == 0:
        raise ValueError(f"{name} must have at least one dimension (the categories), got a scalar")
    if not -p.dim() <= dim < p.dim():
        raise ValueError(f"dim={dim} is out of range for {name} of shape {tuple(p.shape)}")
    with torch.no_grad():
        if torch.isnan(p).any() or (p < 0).any() or (p > 1 + atol).any():
            raise ValueError(f"{name} must hold probabilities in [0, 1] (no NaN)")
        tol = {torch.float64: atol, torch.float32: 1e-4}.get(p.dtype, 1e-2)  # half precision is coarse
        total = p.sum(dim=dim)
        worst = total.flatten()[(total - 1).abs().flatten().argmax()].item()
        if abs(worst - 1) > tol:
            raise ValueError(f"{name} must sum to 1 along dim {dim}; a row sums to {worst:.6g}")


# ---------------------------------------------------------------- distributions
def entropy(p: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Shannon entropy in nats along ``dim``: H(p) = -Σ_i p_i log p_i.  (..., V) -> (...)."""
    _check_distribution(p, "p", dim)
    return -torch.special.xlogy(p, p).sum(dim=dim) + 0.0  # H(p) = -Σ p log p, 0 log 0 = 0 (+0.0: no -0.0)


def distribution_cross_entropy(p: torch.Tensor, q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Cross-entropy in nats of model ``q`` on data ``p``: H(p, q) = -Σ_i p_i log q_i.  (..., V) -> (...).

    Infinite where q gives zero probability to an outcome p thinks possible.
    """
    _check_distribution(p, "p", dim)
    _check_distribution(q, "q", dim)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    return -torch.special.xlogy(p, q).sum(dim=dim) + 0.0  # H(p, q) = -Σ p log q (+0.0: no -0.0)


def kl_divergence(p: torch.Tensor, q: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Kullback–Leibler divergence in nats: KL(p ‖ q) = Σ_i p_i (log p_i - log q_i) ≥ 0.  (..., V) -> (...).

    Equals ``F.kl_div(q.log(), p, reduction="none").sum(dim)`` (note the reversed argument order there) except
    where some p_i = q_i = 0: that term is 0 here and NaN there (0 · (log 0 - log 0)).
    """
    _check_distribution(p, "p", dim)
    _check_distribution(q, "q", dim)
    if p.shape != q.shape:
        raise ValueError(f"p and q must have the same shape, got {tuple(p.shape)} and {tuple(q.shape)}")
    return (torch.special.xlogy(p, p) - torch.special.xlogy(p, q)).sum(dim=dim)  # Σ p log p - Σ p log q


def mutual_information(joint: torch.Tensor) -> torch.Tensor:
    """Mutual information in nats of a joint table P(X = i, Y = j): I(X; Y) = KL(p(x, y) ‖ p(x) p(y))
    = H(Y) - H(Y | X) ≥ 0.  (n_x, n_y) -> scalar."""
    if not isinstance(joint, torch.Tensor) or joint.dim() != 2:
        raise ValueError("joint must be a tensor of shape (n_x, n_y) holding P(X = i, Y = j)")
    independent = joint.sum(1, keepdim=True) * joint.sum(0, keepdim=True)  # p(x) p(y)   (n_x, n_y)
    return kl_divergence(joint.flatten(), independent.flatten())  # checks that the table sums to 1


# ---------------------------------------------------------------- the training loss
def _log_softmax(logits: torch.Tensor) -> torch.Tensor:
    """Stable log-softmax on the last dim: log softmax(z)_i = (z_i - m) - log Σ_j e^{z_j - m}, m = max_j z_j.

    Not z_i - LSE(z) = z_i - (m + log Σ): for large logits that is a difference of two large numbers, and its
    rounding error grows with max |z|. Here z_i - m is one rounding of a number no larger in size than the loss,
    and log Σ lies in [0, log V].
    """
    m = logits.detach().amax(dim=-1, keepdim=True)  # the shift; a constant for the derivative
    m = torch.where(torch.isfinite(m), m, torch.zeros_like(m))  # all -inf (or +inf) rows: shift by 0
    shifted = logits - m  # z_i - m <= 0
    # a row of all -inf: -inf - log 0 = -inf - (-inf) = NaN, as in PyTorch
    return shifted - torch.log(torch.exp(shifted).sum(dim=-1, keepdim=True))


def _check_target_range(targets: torch.Tensor, keep: torch.Tensor, V: int, ignore_index: int) -> None:
    """ValueError unless every kept target id lies in [0, V)."""
    # Skipped while torch.compile traces: reading the ids' range would split its graph. An id out of range then
    # fails inductor's own bounds check (a RuntimeError on a CPU, a device-side assert on CUDA).
    if torch.compiler.is_compiling():
        return
    bad = keep & ((targets < 0) | (targets >= V))
    if bad.any():
        raise ValueError(f"targets must lie in [0, {V}) or equal ignore_index={ignore_index}; found "
                         f"{targets[bad][0].item()}")


def cross_entropy(logits: torch.Tensor, targets: torch.Tensor, *, ignore_index: int = -100,
                  reduction: str = "mean") -> torch.Tensor:
    """The language-model loss in nats: -log softmax(z)_y = LSE(z) - z_y per token, from raw logits.

    logits (N, V) or (B, T, V); targets (N,) or (B, T) integer class ids in [0, V) or ``ignore_index`` (those
    tokens contribute nothing and are left out of the mean). ``reduction``: "mean" (over kept tokens), "sum",
    or "none" (shape of ``targets``, 0 where ignored). Computed as log Σ_j e^{z_j - m} - (z_y - m) with
    m = max_j z_j, so it is stable for any finite logits. A -inf logit at the target gives inf, a row of all -inf
    logits NaN (no distribution), as ``F.cross_entropy`` does: there the shift uses m = 0, the sum of
    exponentials is 0, and log Σ_j e^{z_j} - z_y = -inf - (-inf). A +inf logit away from the target gives inf
    here and NaN in PyTorch. float16 and bfloat16 keep too few bits for a sum of thousands of exponentials, so
    half-precision logits are computed in float32 and the loss is rounded once to the input's dtype.
    """
    if not isinstance(logits, torch.Tensor) or not logits.is_floating_point():
        raise ValueError("logits must be a floating-point torch.Tensor")
    if not isinstance(targets, torch.Tensor) or targets.is_floating_point() or targets.dtype == torch.bool:
        raise ValueError("targets must be an integer torch.Tensor of class ids (for soft targets use "
                         "distribution_cross_entropy)")
    if logits.dim() not in (2, 3):
        raise ValueError(f"logits must be (N, V) or (B, T, V), got shape {tuple(logits.shape)}")
    if targets.shape != logits.shape[:-1]:
        raise ValueError(f"targets must have shape {tuple(logits.shape[:-1])} to match logits "
                         f"{tuple(logits.shape)}, got {tuple(targets.shape)}")
    if reduction not in _REDUCTIONS:
        raise ValueError(f"reduction must be one of {_REDUCTIONS}, got {reduction!r}")
    keep = targets != ignore_index  # (N,) or (B, T)
    _check_target_range(targets, keep, logits.shape[-1], ignore_index)
    safe = torch.where(keep, targets, torch.zeros_like(targets))  # any valid id; masked out below
    out_dtype = logits.dtype
    if logits.dtype in (torch.float16, torch.bfloat16):
        logits = logits.float()  # the sums of log-sum-exp in float32; cast back once at the end
    logp = _log_softmax(logits)  # (..., V)
    nll = -logp.gather(-1, safe.unsqueeze(-1)).squeeze(-1)  # L_t = -log p_t(y_t)   (N,) or (B, T)
    nll = torch.where(keep, nll, torch.zeros_like(nll))
    if reduction == "none":
        return nll.to(out_dtype)
    if reduction == "sum":
        return nll.sum().to(out_dtype)
    return (nll.sum() / keep.sum()).to(out_dtype)  # mean over kept tokens (NaN if all are ignored, like PyTorch)


def perplexity(loss) -> torch.Tensor | float:
    """Perplexity exp(L) of a mean cross-entropy ``loss`` in nats: the effective number of equally likely choices."""
    if isinstance(loss, torch.Tensor):
        if (loss < 0).any():
            raise ValueError("a cross-entropy loss is >= 0; got a negative value")
        return torch.exp(loss)  # PPL = e^L
    if not isinstance(loss, numbers.Real) or loss < 0:  # numbers.Real: int, float, numpy scalars
        raise ValueError(f"loss must be a non-negative number or tensor, got {loss!r}")
    return math.exp(loss)


def bits_per_char(loss_nats, *, chars_per_token: float = 1.0) -> torch.Tensor | float:
    """Bits per character from a mean loss in nats per token: L / (ln 2 · chars_per_token).

    For a character-level model (the book's capstone) ``chars_per_token = 1``. Bits per character times the
    length of a text is its compressed size (within 2 bits) only when the loss conditions every character on all
    of the text before it; the capstone's validation loss restarts its context at each fixed-length window, so
    for it the link is approximate.
    """
    if not chars_per_token > 0:
        raise ValueError(f"chars_per_token must be > 0, got {chars_per_token}")
    if isinstance(loss_nats, torch.Tensor):
        if (loss_nats < 0).any():
            raise ValueError("a cross-entropy loss is >= 0; got a negative value")
    elif not isinstance(loss_nats, numbers.Real) or loss_nats < 0:
        raise ValueError(f"loss_nats must be a non-negative number or tensor, got {loss_nats!r}")
    return loss_nats / (LN2 * chars_per_token)  # bits = nats / ln 2


def attention_entropy(weights: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each query's attention distribution: weights (..., T_q, T_k) -> (..., T_q).

    0 means the query attends to one key; log(number of keys it may see) means uniform attention. A fully masked
    row, which :func:`transformer_lab.attention.scaled_dot_product_attention` returns as all zeros (the query reads
    nothing), gets entropy 0. Every other row must sum to 1. For weights (B, h, T, T) average over the batch and
    queries, ``.mean((0, 2))``, to get one number per head.

    Differentiable through masked attention: a weight that is exactly 0 (a key the query may not see) contributes
    0 to the entropy and 0 to its gradient, so the gradient with respect to the scores is finite. (Through
    ``xlogy`` it would be 0 · (log 0 + 1) = NaN.)
    """
    if not isinstance(weights, torch.Tensor) or weights.dim() < 2:
        raise ValueError("weights must be a tensor of shape (..., T_q, T_k) with rows that sum to 1")
    empty = (weights == 0).all(dim=-1, keepdim=True)  # fully masked rows
    filled = torch.where(empty, torch.ones_like(weights) / weights.shape[-1], weights)  # checked as distributions
    _check_distribution(filled, "weights", -1)
    positive = weights > 0
    safe = torch.where(positive, weights, torch.ones_like(weights))  # log 1 = 0 where w = 0: no -inf, no NaN
    terms = torch.where(positive, weights * torch.log(safe), torch.zeros_like(weights))  # w log w, 0 log 0 = 0
    return -terms.sum(dim=-1) + 0.0  # H = -Σ w log w; an all-zero row gives 0 (+0.0: no -0.0)


# ---------------------------------------------------------------- n-gram estimates of a real text
def _check_ngram_args(text, n) -> None:
    if not isinstance(text, str):
        raise ValueError(f"text must be a str, got {type(text).__name__}")
    if not isinstance(n, int) or isinstance(n, bool) or n < 1:
        raise ValueError(f"n must be an integer >= 1, got {n!r}")
    if len(text) < n:
        raise ValueError(f"text must have at least n={n} characters, got {len(text)}")


def _codes(text: str, n: int, alphabet: str | None = None) -> tuple[np.ndarray, int]:
    """Integer code of every n-gram of ``text`` (base-V digits, the last character least significant)."""
    _check_ngram_args(text, n)
    alphabet = alphabet or "".join(sorted(set(text)))
    V = len(alphabet)
    if n * math.log2(max(V, 2)) > 62:
        raise ValueError(f"n={n} is too large for {V} distinct characters (V**n must fit in 62 bits)")
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)  # (N,) code points
    lut = np.full(max(int(points.max()), max(map(ord, alphabet))) + 1, -1, dtype=np.int64)
    lut[[ord(c) for c in alphabet]] = np.arange(V)
    ids = lut[points]  # (N,) character ids in [0, V)
    if (ids < 0).any():
        raise ValueError("text holds characters that are not in the alphabet")
    return _gram_codes(ids, n, V), V


def ngram_entropy_bits(text: str, n: int) -> float:
    """Conditional entropy of a character given the n-1 before it, H(X_t | X_{t-n+1..t-1}), in **bits** per
    character (divide by log2(e), or multiply by ln 2, for nats).

    The maximum-likelihood ("plug-in") estimate on ``text`` itself: the cross-entropy, on the same text, of the
    best n-gram model fitted to it. n = 1 is the unigram entropy H(X). The text is read as a circle (the last
    n-1 characters are followed by the first ones), so every order counts the same positions and the result is
    non-increasing in n. It is the text's own empirical H_n; as an estimate of the source's H_n it is biased low
    (optimistic) in expectation, increasingly so for large n (the model is scored on the n-grams it counted);
    compare :func:`ngram_baselines_nats` on held-out text.
    """
    _check_ngram_args(text, n)
    code, V = _codes(text + text[:n - 1], n)  # wrap around: every order counts the same len(text) positions
    grams, counts = np.unique(code, return_counts=True)  # c(ctx, x)
    _, ctx_inv = np.unique(grams // V, return_inverse=True)  # context = all but the last character
    ctx_counts = np.bincount(ctx_inv, weights=counts)  # c(ctx) = Σ_x c(ctx, x)
    N = counts.sum()
    return float(-(counts / N * np.log2(counts / ctx_counts[ctx_inv])).sum())  # -Σ P(ctx,x) log2 P(x|ctx)


def ngram_counts(train: str, test: str, n: int) -> tuple[np.ndarray, np.ndarray, int]:
    """For every n-gram h x of ``test`` (h its n-1 character context): its count c(h x) in ``train`` and the count
    c(h) of h there, as the first n-1 characters of an n-gram.  -> c_hx (len(test)-n+1,), c_h (same), V.

    V is the number of distinct characters of train and test together.
    """
    _check_ngram_args(test, n)
    alphabet = "".join(sorted(set(train) | set(test)))
    tr, V = _codes(train, n, alphabet)
    te, _ = _codes(test, n, alphabet)
    grams, counts = np.unique(tr, return_counts=True)
    ctxs, ctx_counts = np.unique(tr // V, return_counts=True)
    return _lookup(te, grams, counts), _lookup(te // V, ctxs, ctx_counts), V  # c(h x), c(h) per test n-gram


def ngram_cross_entropy_bits(train: str, test: str, n: int, *, alpha: float = 0.1) -> float:
    """Cross-entropy in **bits** per character of an add-``alpha`` smoothed character n-gram model fitted on
    ``train``, scored on ``test``.

    P(x | h) = (c(h x) + α) / (c(h) + α V) (counts from :func:`ngram_counts`), V the characters of train and test
    together, averaged over the n-grams of ``test``: an honest, held-out number, but without back-off to shorter
    contexts it gets worse as n grows and contexts become rare; :func:`ngram_baselines_nats` (Kneser–Ney) is the
    better baseline.
    """
    if not alpha > 0:
        raise ValueError(f"alpha must be > 0 (unsmoothed models give unseen characters probability 0), got {alpha}")
    c_hx, c_h, V = ngram_counts(train, test, n)
    return float(-np.log2((c_hx + alpha) / (c_h + alpha * V)).mean())


# ---------------------------------------------------------------- a properly smoothed n-gram baseline
def _ids(text: str, alphabet: str) -> np.ndarray:
    """Character ids of ``text`` in ``alphabet`` (sorted, distinct characters).  str -> (N,) int64."""
    points = np.frombuffer(text.encode("utf-32-le"), dtype=np.uint32).astype(np.int64)
    table = np.array([ord(c) for c in alphabet], dtype=np.int64)
    ids = np.searchsorted(table, points)
    if len(ids) and ((ids >= len(table)) | (table[np.minimum(ids, len(table) - 1)] != points)).any():
        raise ValueError("text holds characters that are not in the alphabet")
    return ids


def _gram_codes(ids: np.ndarray, k: int, V: int) -> np.ndarray:
    """Code Σ_j ids[t+j] V^{k-1-j} of every k-gram (the last character least significant).  (N,) -> (N-k+1,)."""
    L = len(ids) - k + 1
    code = np.zeros(max(L, 0), dtype=np.int64)
    for j in range(k):
        code = code * V + ids[j:j + L]
    return code


def _lookup(keys: np.ndarray, table: np.ndarray, values: np.ndarray) -> np.ndarray:
    """values[i] where table[i] == key (``table`` sorted), else 0."""
    if len(table) == 0:
        return np.zeros(len(keys), dtype=values.dtype)
    i = np.clip(np.searchsorted(table, keys), 0, len(table) - 1)
    return np.where(table[i] == keys, values[i], 0)


class KneserNey:
    """Interpolated Kneser–Ney character n-gram model of order ``n`` fitted on ``text``.

    Level k = n uses counts a(h x) = c(h x); the lower levels k < n use continuation counts a(h x) = N₁₊(• h x),
    the number of distinct characters seen before h x. With D_k the level's discount (unless ``discount`` is given,
    Ney's estimate n₁ / (n₁ + 2 n₂) from the level's numbers n₁, n₂ of counts equal to 1 and 2, or 0.5 where
    n₁ = n₂ = 0; clamped to [1e-6, 1 - 1e-6]) and P₀(x) = 1/V,

        P_k(x | h) = [max(a(h x) − D_k, 0) + D_k · N₁₊(h •) · P_{k−1}(x | h')] / a(h •)     (h' = h without its
                                                                                           first character)
    and P_k(x | h) = P_{k−1}(x | h') where the context was never seen (a(h •) = 0). Every P_k(· | h) sums to 1 over
    the V characters of ``alphabet`` (default: those of ``text``).
    """

    def __init__(self, text: str, n: int, *, alphabet: str | None = None, discount: float | None = None,
                 _raw: dict | None = None):
        _check_ngram_args(text, n)
        if discount is not None and not 0 < discount < 1:
            raise ValueError(f"discount must lie in (0, 1), got {discount}")
        self.alphabet = alphabet or "".join(sorted(set(text)))
        self.n, V = n, len(self.alphabet)
        if n * math.log2(max(V, 2)) > 62:
            raise ValueError(f"n={n} is too large for {V} distinct characters (V**n must fit in 62 bits)")
        raw = _raw if _raw is not None else _raw_counts(_ids(text, self.alphabet), n, V)
        self.levels = []  # per level k: (grams, a(g), contexts, a(h•), N₁₊(h•), D_k)
        for k in range(1, n + 1):
            grams, a = raw[k] if k == n else _continuation(raw[k + 1][0], k, V)
            ctx, inv = np.unique(grams // V, return_inverse=True)  # h = all but the last character
            a_ctx = np.bincount(inv, weights=a)  # a(h •) = Σ_x a(h x)
            n_ctx = np.bincount(inv)  # N₁₊(h •): distinct x with a(h x) > 0
            n1, n2 = (a == 1).sum(), (a == 2).sum()
            D = discount if discount is not None else (n1 / (n1 + 2 * n2) if n1 + 2 * n2 else 0.5)
            self.levels.append((grams, a, ctx, a_ctx, n_ctx, float(min(max(D, 1e-6), 1 - 1e-6))))

    def _prob(self, ids: np.ndarray, t: np.ndarray, x: np.ndarray, history: np.ndarray) -> np.ndarray:
        """P(x | the last min(n-1, history) characters of ``ids`` before position t), elementwise over arrays."""
        V = len(self.alphabet)
        p = np.full(len(t), 1.0 / V)  # P₀ = uniform
        for k, (grams, a, ctx, a_ctx, n_ctx, D) in enumerate(self.levels, start=1):
            ok = history >= k - 1  # positions with k-1 characters of history
            h = np.zeros(len(t), dtype=np.int64)
            for j in range(k - 1, 0, -1):  # context code of ids[t-k+1 .. t-1]
                h = h * V + np.where(ok, ids[np.maximum(t - j, 0)], 0)
            c_hx = _lookup(h * V + x, grams, a)
            c_h = _lookup(h, ctx, a_ctx)
            seen = ok & (c_h > 0)
            safe = np.where(seen, c_h, 1)
            mixed = (np.maximum(c_hx - D, 0) + D * _lookup(h, ctx, n_ctx) * p) / safe
            p = np.where(seen, mixed, p)
        return p

    def distribution(self, context: str) -> np.ndarray:
        """P(· | context) over the alphabet, from the last n-1 characters of ``context``.  -> (V,)."""
        ids = _ids(context, self.alphabet)
        V = len(self.alphabet)
        full = np.concatenate([np.repeat(ids[None, :], V, 0), np.arange(V)[:, None]], axis=1).ravel()
        t = np.arange(V) * (len(ids) + 1) + len(ids)  # the position of x in each row
        return self._prob(full, t, np.arange(V), np.full(V, len(ids)))

    def cross_entropy(self, text: str) -> float:
        """Mean −ln P(x_t | x_{t−n+1..t−1}) over every character of ``text``, in nats per character.

        The first n−1 characters, which have shorter histories, are predicted from the history they have.
        """
        ids = _ids(text, self.alphabet)
        if len(ids) == 0:
            raise ValueError("text must not be empty")
        t = np.arange(len(ids))
        return float(-np.log(self._prob(ids, t, ids, t)).mean())


def _raw_counts(ids: np.ndarray, n: int, V: int) -> dict:
    """{k: (distinct k-gram codes, their counts)} for k = 1 … n."""
    return {k: np.unique(_gram_codes(ids, k, V), return_counts=True) for k in range(1, n + 1)}


def _continuation(grams_above: np.ndarray, k: int, V: int) -> tuple[np.ndarray, np.ndarray]:
    """Continuation counts N₁₊(• g) of k-grams g from the distinct (k+1)-gram codes: how many x precede g."""
    return np.unique(grams_above % V ** k, return_counts=True)


def ngram_baselines_nats(text: str, orders=(1, 2, 3, 5), *, held_out: str | None = None,
                         discount: float | None = None) -> dict:
    """Held-out cross-entropy in **nats** per character, ``{n: nats}``, of interpolated Kneser–Ney n-gram models
    (nats, the unit of the training loss, so that a model's validation loss can be compared directly).

    Each model (:class:`KneserNey`) is fitted on ``text`` and scored on every character of ``held_out``
    (default: fit on the first 90 % of ``text``, score the last 10 %). The alphabet is the union of both texts'
    characters. These are baselines — what a simple, properly smoothed model achieves — so a language model
    scored on the same text should do better; they are not lower bounds on what any model can reach.
    """
    if not isinstance(text, str) or (held_out is not None and not isinstance(held_out, str)):
        raise ValueError("text and held_out must be str")
    if held_out is None:
        cut = int(0.9 * len(text))
        text, held_out = text[:cut], text[cut:]
    orders = [int(n) for n in orders]
    if not orders or min(orders) < 1:
        raise ValueError(f"orders must be integers >= 1, got {orders}")
    alphabet = "".join(sorted(set(text) | set(held_out)))
    _check_ngram_args(text, max(orders))
    raw = _raw_counts(_ids(text, alphabet), max(orders), len(alphabet))
    return {n: KneserNey(text, n, alphabet=alphabet, discount=discount, _raw=raw).cross_entropy(held_out)
            for n in orders}

