"""Chapter 6 (combinatorics) exercises: automatic checks.

* ``sinusoidal(n_pos, d_model)`` — the sinusoidal encoding, (n_pos, d_model), float64
* ``rotation_for_offset(k, d_model)`` — R(k) with PE(pos + k) = R(k) · PE(pos), (d_model, d_model)
* ``rope(x)`` — rotary encoding of x (T, d) at positions 0 … T-1, interleaved pairs
* ``rope_score(q1, q2, k1, k2, delta, theta)`` — the RoPE score of one pair, Rot(mθ)q · Rot(nθ)k, written in the
  offset δ = n - m alone, a SymPy expression
* ``kv_causal_mask(T, T_k)`` — the causal mask when the T queries are the last T of T_k positions
* ``kv_pair_count(T, T_k)`` — how many (query, key) pairs that mask admits, an int
* ``alibi(T, n_head)`` — ALiBi's score bias m_h · (j - i), (n_head, T, T), m_h = 2^{-8h/H}, H a power of 2
* ``head_splits(d_model, n_head)`` — ways to deal d_model coordinates into n_head unordered heads, an int
* ``is_equivariant(layer, x)`` — whether layer(x[perm]) = layer(x)[perm] for every permutation of x's T rows, a bool
* ``score_drift(kind, q, k, T_train, T_test)`` — how much a score at an offset seen in training changes when the
  pair moves up to T_test, for sinusoidal, RoPE or ALiBi positions, a float
* ``layer_comparison(n, d)`` — (multiply-adds, sequential steps, path length) of a self-attention and a
  recurrent layer, a dict of int triples
* ``untrained_rows(table, T_train, n_steps, lr, weight_decay)`` — the rows of a learned position table that no
  training sequence of length T_train reaches, after n_steps of AdamW, (T_max - T_train, d)
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import torch

from transformer_lab import positional as P
from transformer_lab.attention import MultiHeadAttention
from transformer_lab.exercises import (
    CheckResult,
    check_expression,
    check_function,
    describe_difference,
    distinct_digits,
    generator,
)


def _ref_sinusoidal(n_pos, d_model):
    return P.sinusoidal_encoding(n_pos, d_model, dtype=torch.float64)


def _slip_hint(got, expected, slips) -> str:
    """``"; hint: …"`` for the first ``(value, hint)`` in ``slips`` whose value the answer equals (and the reference
    does not), else ``""``: a typical slip recognised by what it computes on this case."""
    if not isinstance(got, torch.Tensor | np.ndarray) or tuple(got.shape) != tuple(expected.shape):
        return ""
    got = torch.as_tensor(got).detach().double()
    for value, hint in slips:
        value = value.double()
        if torch.allclose(got, value, atol=1e-6, rtol=1e-5) and not torch.allclose(expected.double(), value,
                                                                                    atol=1e-6, rtol=1e-5):
            return f"; hint: {hint}"
    return ""


def _sinusoid(n_pos, d_model, *, angle_exponent, start=0, swap=False, multiply=False, blocks=False):
    """A sinusoidal table with one typical slip: ``angle_exponent(j)`` gives column j's exponent e in
    pos / 10000^e (right: 2⌊j/2⌋/d)."""
    pos = torch.arange(start, start + n_pos, dtype=torch.float64)[:, None]  # (n_pos, 1)
    j = torch.arange(d_model)
    e = angle_exponent(j).to(torch.float64)
    angle = pos * 10000.0**e if multiply else pos / 10000.0**e  # (n_pos, d_model)
    sin_column = (j % 2 == 0) != swap
    pe = torch.where(sin_column, angle.sin(), angle.cos())
    return torch.cat((pe[:, 0::2], pe[:, 1::2]), dim=1) if blocks else pe


def _sinusoidal_slips(n_pos, d_model) -> list:
    d = d_model
    right = lambda j: 2 * (j // 2) / d  # noqa: E731  the exponent 2i/d of pair i = ⌊j/2⌋
    return [
        (_sinusoid(n_pos, d, angle_exponent=right, swap=True),
         "sin and cos are swapped: the even columns 2i hold sin(pos·ω_i), the odd ones 2i+1 cos(pos·ω_i)"),
        (_sinusoid(n_pos, d, angle_exponent=lambda j: (j // 2) / d),
         "the exponent is 2i/d_model for pair i (columns 2i and 2i+1): ω_i = 10000^(-2i/d_model), not 10000^(-i/d)"),
        (_sinusoid(n_pos, d, angle_exponent=lambda j: j / d),
         "the two columns of a pair share one frequency: column 2i+1 uses 10000^(-2i/d_model) like column 2i, not "
         "its own index (2i+1)/d_model"),
        (_sinusoid(n_pos, d, angle_exponent=lambda j: 2 * j / d),
         "i counts pairs, not columns: column j belongs to pair i = j // 2, whose exponent is 2i/d_model"),
        (_sinusoid(n_pos, d, angle_exponent=right, start=1),
         "positions start at 0: row 0 is PE(0) = (0, 1, 0, 1, …), not PE(1)"),
        (_sinusoid(n_pos, d, angle_exponent=right, multiply=True),
         "divide the position by 10000^(2i/d_model) (ω_i = 10000^(-2i/d) is at most 1), do not multiply"),
        (_sinusoid(n_pos, d, angle_exponent=right, blocks=True),
         "interleave: sin in the even columns and cos in the odd ones, not all sines then all cosines"),
    ]


def check_sinusoidal(fn) -> CheckResult:
    """``fn(n_pos, d_model) -> (n_pos, d_model)``: PE[pos, 2i] = sin(pos / 10000^{2i/d}), PE[pos, 2i+1] = cos."""
    cases = [{"n_pos": 4, "d_model": 2}, {"n_pos": 10, "d_model": 8}, {"n_pos": 50, "d_model": 32},
             {"n_pos": 1, "d_model": 6}]
    current = iter(cases)

    def compare(got, expected):
        case = next(current)
        msg = describe_difference(got, expected, atol=1e-6, rtol=1e-5)
        return msg and msg + _slip_hint(got, expected, _sinusoidal_slips(**case))

    return check_function("sinusoidal", fn, _ref_sinusoidal, cases, compare=compare)


def _ref_rotation(k, d_model):
    return P.relative_rotation(k, d_model, dtype=torch.float64)


def check_rotation_for_offset(fn) -> CheckResult:
    """``fn(k, d_model) -> (d_model, d_model)``: the block-diagonal R(k) with PE(pos + k) = R(k) PE(pos)."""
    cases = [{"k": 1, "d_model": 2}, {"k": 3, "d_model": 4}, {"k": 10, "d_model": 8}, {"k": -2, "d_model": 6}]

    def compare(got, expected):
        msg = describe_difference(got, expected, atol=1e-6, rtol=1e-5)  # float32 ok
        if msg is None or not isinstance(got, torch.Tensor | np.ndarray) or tuple(got.shape) != tuple(expected.shape):
            return msg
        if torch.allclose(torch.as_tensor(got).double(), expected.T, atol=1e-6, rtol=1e-5):
            return msg + ("; hint: that is the transpose, Rot(kω) per block: the pair is stored as (sin, cos), "
                          "so the block is [[cos kω, sin kω], [-sin kω, cos kω]]")
        return msg

    return check_function("rotation_for_offset", fn, _ref_rotation, cases, compare=compare)


def _ref_rope(x):
    return P.apply_rope(x)


def _rotary(x, *, exponent=lambda i, d: 2 * i / d, sign=1.0, start=0, halves=False):
    """RoPE with one typical slip: pair i's frequency 10000^(-exponent(i, d)), the angle's sign, the first position,
    or pairs (i, i + d/2) in place of (2i, 2i+1)."""
    T, d = x.shape
    omega = 10000.0 ** (-exponent(torch.arange(d // 2, dtype=torch.float64), d))  # (d/2,)
    angle = sign * (torch.arange(T, dtype=torch.float64)[:, None] + start) * omega  # (T, d/2)
    if halves:
        x1, x2 = x[:, : d // 2], x[:, d // 2:]
        return torch.cat((x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()), dim=1)
    x1, x2 = x[:, 0::2], x[:, 1::2]
    return torch.stack((x1 * angle.cos() - x2 * angle.sin(), x1 * angle.sin() + x2 * angle.cos()), -1).flatten(1)


def _rope_slips(x) -> list:
    return [
        (_rotary(x, sign=-1.0),
         "the rotation turns the wrong way: x'_{2i} = x_{2i} cos mω_i - x_{2i+1} sin mω_i and x'_{2i+1} = x_{2i} sin "
         "mω_i + x_{2i+1} cos mω_i (counter-clockwise by +mω_i)"),
        (_rotary(x, halves=True),
         "the pairs are (x_{2i}, x_{2i+1}), neighbours, not the two halves (x_i, x_{i + d/2}) of the rotate_half "
         "layout (GPT-NeoX, LLaMA code)"),
        (_rotary(x, exponent=lambda i, d: i / d), "ω_i = 10000^(-2i/d) for pair i, not 10000^(-i/d)"),
        (_rotary(x, exponent=lambda i, d: 4 * i / d),
         "i counts pairs: pair i (columns 2i, 2i+1) has ω_i = 10000^(-2i/d); the column index 2i in its place "
         "gives 10000^(-4i/d)"),
        (_rotary(x, exponent=lambda i, d: 2 * (i + 1) / d), "pairs count from i = 0: the first pair has ω_0 = 1"),
        (_rotary(x, start=1), "positions start at 0: row m is rotated by m·ω_i, so row 0 is left unchanged"),
        (_rotary(x, exponent=lambda i, d: 0 * i), "each pair has its own frequency ω_i = 10000^(-2i/d), not 1"),
    ]


def check_rope(fn) -> CheckResult:
    """``fn(x (T, d)) -> (T, d)``: pair (x[m, 2i], x[m, 2i+1]) rotated by m·ω_i, ω_i = 10000^{-2i/d}."""
    g = generator(7)
    cases = [{"x": torch.randn(3, 2, generator=g, dtype=torch.float64)},
             {"x": torch.randn(6, 8, generator=g, dtype=torch.float64)},
             {"x": torch.randn(12, 16, generator=g, dtype=torch.float64)}]
    current = iter(cases)

    def compare(got, expected):  # angles in float32 are right too
        case = next(current)
        msg = describe_difference(got, expected, atol=1e-6, rtol=1e-5)
        return msg and msg + _slip_hint(got, expected, _rope_slips(case["x"]))

    return check_function("rope", fn, _ref_rope, cases, compare=compare)


def _ref_rope_score(q1, q2, k1, k2, delta, theta):
    """q^T Rot(δθ) k = cos(δθ)(q1 k1 + q2 k2) + sin(δθ)(q2 k1 - q1 k2), Rot(a) = [[cos a, -sin a], [sin a, cos a]]
    (tests/test_exercises_ch6.py derives it from Rot(mθ)q · Rot(nθ)k with n = m + δ)."""
    import sympy as sp

    return sp.cos(delta * theta) * (q1 * k1 + q2 * k2) + sp.sin(delta * theta) * (q2 * k1 - q1 * k2)


def check_rope_score(fn) -> CheckResult:
    """``fn(q1, q2, k1, k2, delta, theta) -> sympy expression`` in those symbols only (no m, n)."""
    import sympy as sp

    q1, q2, k1, k2, delta, theta = sp.symbols("q1 q2 k1 k2 delta theta", real=True)
    cases = [{"q1": q1, "q2": q2, "k1": k1, "k2": k2, "delta": delta, "theta": theta}]
    cos, sin = sp.cos, sp.sin
    hints = [
        (lambda q1, q2, k1, k2, delta, theta: cos(delta * theta) * (q1 * k1 + q2 * k2)
         - sin(delta * theta) * (q2 * k1 - q1 * k2),
         "δ is n - m, the key's position minus the query's: with m - n the sine term changes sign (or a rotation is "
         "clockwise)"),
        (lambda q1, q2, k1, k2, delta, theta: cos(delta * theta) * (q1 * k1 + q2 * k2),
         "a rotation mixes the two coordinates: a term sin(δθ)(q2 k1 - q1 k2) remains"),
        (lambda q1, q2, k1, k2, delta, theta: cos(delta) * (q1 * k1 + q2 * k2) + sin(delta) * (q2 * k1 - q1 * k2),
         "the angle is δθ, the offset times the frequency"),
        (lambda q1, q2, k1, k2, delta, theta: q1 * k1 + q2 * k2,
         "rotate the key by its own position nθ = (m + δ)θ, not by the query's"),
    ]
    return check_expression("rope_score", fn, _ref_rope_score, cases, hints=hints)


def _ref_kv_mask(T, T_k):
    return P.causal_mask(T, T_k)


def check_kv_causal_mask(fn) -> CheckResult:
    """``fn(T, T_k) -> bool (T, T_k)``: True where query i (position T_k - T + i) may see key j."""
    cases = [{"T": 3, "T_k": 3}, {"T": 1, "T_k": 5}, {"T": 2, "T_k": 6}, {"T": 4, "T_k": 7}]

    def compare(got, expected):
        if isinstance(got, np.ndarray):  # a NumPy mask is accepted, as check_sinusoidal accepts NumPy arrays
            got = torch.from_numpy(got)
        if not isinstance(got, torch.Tensor):
            return f"output should be a bool torch.Tensor (True = may attend), got a {type(got).__name__}"
        if got.dtype != torch.bool:
            return f"output should have dtype bool (True = may attend), got dtype {got.dtype}"
        return describe_difference(got, expected)

    return check_function("kv_causal_mask", fn, _ref_kv_mask, cases, compare=compare)


def _ref_kv_pair_count(T, T_k):
    return P.causal_mask(T, T_k).sum().item()  # counted from the mask itself, not from the formula


def check_kv_pair_count(fn) -> CheckResult:
    """``fn(T, T_k) -> int``: the True entries of the key-value-cache mask, T (T_k - T) + T (T + 1) / 2."""
    cases = [{"T": 1, "T_k": 1}, {"T": 3, "T_k": 3}, {"T": 1, "T_k": 9}, {"T": 4, "T_k": 7}, {"T": 50, "T_k": 1000}]
    hints = [
        (lambda T, T_k: T * T_k, "that counts every (query, key) pair: key j is visible only up to the query's own "
                                 "position T_k - T + i"),
        (lambda T, T_k: T * (T + 1) // 2, "that is the count without a cache: each query also sees the T_k - T "
                                          "cached keys before the new ones"),
        (lambda T, T_k: T * (T_k - T) + T * (T - 1) // 2, "one short per query: a query also sees its own key"),
        (lambda T, T_k: T_k * (T_k + 1) // 2, "that counts all T_k queries; only the last T are new"),
    ]

    return _check_count("kv_pair_count", fn, _ref_kv_pair_count, cases, hints)


def _check_count(name: str, fn, reference, cases: list[dict], hints: list) -> CheckResult:
    """Check an exercise whose answer is an int; when the answer equals a typical mistake's formula
    ``wrong(*case)`` on every case, name that mistake (``hints``: (wrong, hint) pairs)."""
    def compare(got, expected):
        msg = describe_difference(got, expected)
        return f"the count is {got}, expected {expected}" if msg and "differs" in msg else msg

    result = check_function(name, fn, reference, cases, compare=compare)
    if result.passed:
        return result
    try:  # a typical mistake gives a known formula on every case: name it
        answers = [fn(*c.values()) for c in cases]
    except Exception:  # check_function has already reported it
        return result
    for wrong, hint in hints:
        if all(a == wrong(*c.values()) and not isinstance(a, bool) for a, c in zip(answers, cases, strict=True)):
            return CheckResult(result.name, False, f"{result.message}; hint: {hint}")
    return result


def _ref_alibi(T, n_head):
    return P.alibi_bias(T, n_head=n_head, dtype=torch.float64)


def check_alibi(fn) -> CheckResult:
    """``fn(T, n_head) -> (n_head, T, T)``: entry (h-1, i, j) = m_h · (j - i), m_h = 2^{-8h/H}, h = 1 … H."""
    cases = [{"T": 4, "n_head": 8}, {"T": 5, "n_head": 4}, {"T": 3, "n_head": 2}, {"T": 1, "n_head": 1}]

    def compare(got, expected):
        msg = describe_difference(got, expected, atol=1e-12, rtol=1e-9)
        if msg is None or not isinstance(got, torch.Tensor) or got.shape != expected.shape:
            return msg
        H, T = expected.shape[0], expected.shape[1]
        if T > 1 and torch.allclose(got.double(), -expected):
            return msg + ("; hint: the sign is flipped, or i and j are swapped — keys behind the query (j < i) get "
                          "a penalty, m_h·(j - i) < 0")
        if H > 1 and T > 1 and torch.allclose(got.double(), expected.flip(0)):
            return msg + (f"; hint: the heads are in reverse order — head 1 has the steepest slope "
                          f"2^{{-8/H}} = 2^{{-{8 / H:g}}}")
        if T > 1 and torch.isneginf(got[:, 0, 1]).all():
            return msg + "; hint: leave the mask out (-inf above the diagonal): it is applied separately"
        first = got[0, -1, 0].item() / (1 - T) if T > 1 else None  # the slope of head 1, read off the matrix
        if first is not None and abs(first - 1.0) < 1e-9:
            return msg + "; hint: head h runs from 1 to H, so the first slope is 2^{-8/H}, not 2^0 = 1"
        if first is not None and H != 8 and abs(first - 0.5) < 1e-9:
            return msg + (f"; hint: the slopes are 2^{{-8h/H}} with H = {H}, not 2^{{-h}} "
                          "(which is right for H = 8 only)")
        dist = (torch.arange(T)[None, :] - torch.arange(T)[:, None]).to(torch.float64)  # (T, T): j - i
        h = torch.arange(1, H + 1, dtype=torch.float64)[:, None, None]
        return msg + _slip_hint(got, expected, [
            (-expected.abs(), "above the diagonal (j > i) the bias is m_h·(j - i) > 0, not -m_h·|j - i|: the causal "
                              "mask hides those entries later, so keep the plain offset j - i"),
            (h * 2.0 ** (-8 / H) * dist, f"the slopes are geometric, m_h = 2^{{-8h/H}} = (2^{{-8/H}})^h: each head's "
                                         f"slope is 2^{{-8/H}} = 2^{{-{8 / H:g}}} times the previous one, not "
                                         f"h·2^{{-8/H}}"),
            (2.0 ** (-8 / h) * dist, "m_h = 2^{-8h/H}: h multiplies the exponent and H divides it, not 2^{-8/h}"),
            (2.0 ** (-h / H) * dist, "m_h = 2^{-8h/H}: the exponent has the factor 8, the last head's slope is 2^{-8}"),
            (2.0 ** (-8 * h / H) * dist.abs(), "the offset is j - i, negative for keys behind the query (j < i), "
                                               "not |j - i|"),
        ])

    return check_function("alibi", fn, _ref_alibi, cases, compare=compare)


def _ref_head_splits(d_model, n_head):
    return P.head_partitions(d_model, n_head)


def check_head_splits(fn) -> CheckResult:
    """``fn(d_model, n_head) -> int``: set partitions into n_head blocks of d_k = d/h, d! / ((d_k!)^h h!)."""
    cases = [{"d_model": 4, "n_head": 2}, {"d_model": 6, "n_head": 3}, {"d_model": 8, "n_head": 2},
             {"d_model": 6, "n_head": 1}, {"d_model": 12, "n_head": 4}, {"d_model": 16, "n_head": 4}]
    f = math.factorial
    hints = [
        (lambda d, h: f(d) // f(d // h) ** h, "that counts labelled heads: each split is counted once per order of "
                                              "its h heads, so divide by h!"),
        (lambda d, h: math.comb(d, d // h), "that is only head 1's choice, C(d, d_k): head 2 then chooses from the "
                                            "d - d_k left, and so on"),
        (lambda d, h: f(d) // (f(d // h) * f(h)), "(d_k!)^h, not d_k!: each of the h heads ignores the order of its "
                                                  "own d_k coordinates"),
        (lambda d, h: f(d) // f(h), "divide by (d_k!)^h as well: the order of the coordinates inside a head does not "
                                    "matter"),
    ]

    return _check_count("head_splits", fn, _ref_head_splits, cases, hints)


class _Layer:
    """A layer (T, C) -> (T, C) for the equivariance exercise, shown by its name in the checker's messages."""

    def __init__(self, name: str, fn, hint: str):
        self.name, self.fn, self.hint = name, fn, hint

    def __call__(self, x):
        return self.fn(x)

    def __repr__(self):
        return f"<{self.name}>"


def _ref_is_equivariant(layer, x):
    """Every one of the T! orders of x's rows: layer(x[perm]) = layer(x)[perm] up to rounding."""
    out = layer(x)
    tol = dict(rtol=1e-4, atol=1e-5) if x.dtype == torch.float32 else dict(rtol=1e-9, atol=1e-12)
    return all(torch.allclose(layer(x[list(p)]), out[list(p)], **tol)
               for p in itertools.permutations(range(x.shape[0])))


_ONE_ORDER = ("try several permutations (random ones, or all T! of them for small T), not one fixed swap, shift or "
              "reversal: a layer can commute with that one permutation and not with the others")


def _ring_next(ring: tuple[int, ...]) -> list[int]:
    """The index of each position's successor on ``ring`` (a cyclic order of the positions)."""
    nxt = [0] * len(ring)
    for a, b in zip(ring, ring[1:] + ring[:1], strict=True):
        nxt[a] = b
    return nxt


def _equivariance_layers() -> list[tuple[_Layer, torch.Tensor]]:
    """The seven cases the page describes, the checker's first: (layer, x) with T = 4 tokens of width 8; attention is
    our MultiHeadAttention."""
    g = generator(6)
    torch_state = torch.random.get_rng_state()
    torch.manual_seed(6)
    mha = MultiHeadAttention(8, 2).double()
    mlp = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.GELU(), torch.nn.Linear(16, 8)).double()
    torch.random.set_rng_state(torch_state)
    mha32 = MultiHeadAttention(8, 2)
    mha32.load_state_dict({k: v.float() for k, v in mha.state_dict().items()})
    pe = P.sinusoidal_encoding(4, 8, dtype=torch.float64)
    last = torch.zeros(4, 8, dtype=torch.float64)
    last[-1] = 1.0  # a marker on the last position only

    def attn(m, mask=None):
        return lambda x: m(query=x[None], key=x[None], value=x[None], mask=mask)[0]

    swap = _ONE_ORDER
    compare = ("compare layer(x[perm]) with layer(x)[perm], the output reordered the same way (not with layer(x) "
               "itself: that is invariance; not with the inverse order), within a tolerance (torch.allclose): the "
               "sums over keys run in another order and round differently, even in float64")
    layers = [
        _Layer("attention, no positions, no mask", attn(mha), compare),
        _Layer("attention with a causal mask", attn(mha, P.causal_mask(4)),
               "the causal mask lets query i see keys 0 … i only: which keys a token sees depends on its position"),
        _Layer("attention after adding sinusoidal positions", lambda x: attn(mha)(x + pe),
               "adding PE(t) to row t ties every row to a position: moving a token changes what is added to it"),
        _Layer("a token-wise MLP", mlp, compare),
        _Layer("attention in float32", attn(mha32),
               compare + "; in float32 a tolerance of float64's size is too strict: rounding differs by "
                         "about 1e-7 of the values (torch.allclose's defaults are fine)"),
        _Layer("attention with a marker added to the last position", lambda x: attn(mha)(x + last),
               "it adds a marker to whatever token is last; " + swap),
        _Layer("a running sum over the tokens", lambda x: x.cumsum(0),
               "row t sums rows 0 … t: reordering the input changes which rows each output sums"),
    ]
    x = torch.randn(4, 8, generator=g, dtype=torch.float64)
    return [(layer, x.float() if "float32" in layer.name else x) for layer in layers]


def _partial_symmetry_layers() -> list[tuple[_Layer, torch.Tensor]]:
    """The checker's further cases, after the page's seven (:func:`_equivariance_layers`, same x, T = 4): layers
    that commute with some orders of the tokens and not with others. Each single fixed permutation of 4 tokens is
    a symmetry of one of them (or of the marker on the last position), so an answer that tests one order is fooled."""
    (_, x), *_ = _equivariance_layers()
    torch_state = torch.random.get_rng_state()
    torch.manual_seed(6)
    mha = MultiHeadAttention(8, 2).double()  # the same weights as the page's seven
    torch.random.set_rng_state(torch_state)
    markers = torch.eye(4, dtype=torch.float64)[:, :, None].expand(4, 4, 8)  # markers[k]: 1 on row k only

    def attn(x):
        return mha(query=x[None], key=x[None], value=x[None])[0]

    swap = _ONE_ORDER
    layers = [
        *(_Layer(f"attention with a marker added to token {k}", lambda x, m=markers[k]: attn(x + m),
                 f"it adds a marker to whatever token is at position {k}, so it commutes with every order that "
                 f"leaves token {k} in place (such as {example}) and with no other; " + swap)
          for k, example in ((0, "swapping the last two"), (1, "a cycle of tokens 0, 2, 3"),
                             (2, "a cycle of tokens 0, 1, 3"))),
        *(_Layer(f"attention after mixing each token with its two neighbours on the ring {'-'.join(map(str, r))}",
                 lambda x, r=r: attn(x + 0.5 * (x[_ring_next(r)] + x[_ring_next(r[::-1])])),
                 f"the tokens sit on a ring ({', '.join(map(str, r))}, back to {r[0]}) and each gets its two "
                 f"neighbours, so it commutes with the rotations and reflections of that ring (8 of the 24 orders, "
                 f"such as {example}) and with no other; " + swap)
          for r, example in (((0, 1, 2, 3), "a cyclic shift, torch.roll, or the reversed order, x.flip(0)"),
                             ((0, 2, 1, 3), "swapping tokens 0 and 1"),
                             ((0, 1, 3, 2), "swapping the first and the last token"))),
    ]
    return [(layer, x) for layer in layers]


def check_is_equivariant(fn) -> CheckResult:
    """``fn(layer, x (T, C)) -> bool``: True when layer(x[perm]) = layer(x)[perm] (to rounding) for every perm."""
    if not callable(fn):
        return CheckResult("is_equivariant", False, f"expected a function, got {type(fn).__name__}")

    def compare(got, expected):
        if isinstance(got, torch.Tensor) and got.numel() == 1 and got.dtype == torch.bool:
            got = bool(got)
        if not isinstance(got, bool | np.bool_):
            return f"the answer must be a bool (True: equivariant), got {type(got).__name__} {got!r}"
        return None if bool(got) == expected else f"the answer is {bool(got)}, expected {expected}"

    cases = _equivariance_layers() + _partial_symmetry_layers()
    for n, (layer, x) in enumerate(cases, start=1):
        result = check_function("is_equivariant", fn, _ref_is_equivariant, [{"layer": layer, "x": x}],
                                compare=compare)
        if not result.passed:
            if result.message.startswith("the answer is"):
                return CheckResult(result.name, False, f"{layer.name} (case {n} of {len(cases)}): "
                                   f"{result.message.split(' (on case')[0]}; hint: {layer.hint}")
            return result
    return CheckResult("is_equivariant", True, f"right on all {len(cases)} layers")


def _scores(kind, q, k, T):
    """S[m, n], the score of query q at position m and key k at position n, (T, T)."""
    d = q.shape[-1]
    if kind == "sinusoidal":
        pe = P.sinusoidal_encoding(T, d, dtype=torch.float64)
        return (q + pe) @ (k + pe).T  # (q + PE(m)) · (k + PE(n))
    if kind == "rope":
        return P.apply_rope(q.expand(T, d)) @ P.apply_rope(k.expand(T, d)).T  # Rot(mθ)q · Rot(nθ)k
    if kind == "alibi":
        pos = torch.arange(T, dtype=torch.float64)
        return q @ k + 0.5 * (pos[None, :] - pos[:, None])  # q·k + m_1 (n - m), head 1 of 8
    raise ValueError(f"kind must be 'sinusoidal', 'rope' or 'alibi', got {kind!r}")


def _drift(S, T_train):
    """max over offsets δ < T_train and pairs (m, m - δ) of |S[m, m - δ] - S[δ, 0]|."""
    return max((S.diagonal(-delta) - S[delta, 0]).abs().max().item() for delta in range(T_train))


def _ref_score_drift(kind, q, k, T_train, T_test):
    return _drift(_scores(kind, q.double(), k.double(), T_test), T_train)


def _drift_mistakes(kind, q, k, T_train, T_test) -> list[tuple[float, str]]:
    """(the answer a typical mistake gives, its hint) for one case."""
    q, k = q.double(), k.double()
    d = q.shape[-1]
    out = [(_drift(_scores(kind, q, k, T_test), T_test), "only offsets seen in training count: δ < T_train, "
                                                         "not every offset up to T_test"),
           (_drift(_scores(kind, q, k, T_train), T_train), "move the pairs beyond the training length: positions "
                                                           "up to T_test - 1, not T_train - 1"),
           (max((S := _scores(kind, q, k, T_test)).diagonal(-delta).sub(S.diagonal(-delta)[T_train - 1 - delta])
                .abs().max().item() for delta in range(T_train)),
            "compare with the score of the same offset at the start, S[δ, 0], the pair at positions (δ, 0)")]
    if kind == "sinusoidal":
        pe = P.sinusoidal_encoding(T_test, d, dtype=torch.float64)
        out.append((_drift(pe @ pe.T, T_train), "the score is (q + PE(m))·(k + PE(n)): PE(m)·PE(n) alone depends "
                                                "on m - n only, but the cross terms q·PE(n) and PE(m)·k do not"))
    if kind == "rope":
        S = P.apply_rope(q.expand(T_test, d)) @ P.apply_rope(k.expand(T_test, d), -torch.arange(T_test)).T
        out.append((_drift(S, T_train), "rotate the query and the key the same way, by mθ and nθ: opposite "
                                        "rotations give a score that depends on m + n"))
    return out


def check_score_drift(fn) -> CheckResult:
    """``fn(kind, q (d,), k (d,), T_train, T_test) -> float``: max |S[m, m - δ] - S[δ, 0]| over δ < T_train."""
    g = generator(3)
    q, k = torch.randn(2, 16, generator=g, dtype=torch.float64)
    cases = [{"kind": kind, "q": q, "k": k, "T_train": 16, "T_test": 64} for kind in ("sinusoidal", "rope", "alibi")]
    cases += [{"kind": "sinusoidal", "q": k, "k": q, "T_train": 4, "T_test": 10},
              {"kind": "rope", "q": q[:8], "k": k[:8], "T_train": 4, "T_test": 10}]

    def compare(got, expected):
        if isinstance(got, torch.Tensor) and got.numel() == 1:
            got = got.item()
        if isinstance(got, bool) or not isinstance(got, float | int | np.floating):
            return f"the answer must be a float, got {type(got).__name__}"
        if abs(got - expected) <= 1e-4 + 1e-4 * abs(expected):
            return None
        shown = distinct_digits(float(got), expected)
        return f"the drift is {shown[0]}, expected {shown[1]}"

    result = check_function("score_drift", fn, _ref_score_drift, cases, compare=compare)
    if result.passed or not result.message.startswith("the drift is"):
        return result
    n = int(result.message.rsplit("(on case ", 1)[1].split(":")[0])
    case = cases[n - 1]
    got = float(fn(*(v.clone() if isinstance(v, torch.Tensor) else v for v in case.values())))
    for wrong, hint in _drift_mistakes(**case):
        if abs(got - wrong) <= 1e-6 + 1e-6 * abs(wrong) and abs(wrong - _ref_score_drift(**case)) > 1e-3:
            return CheckResult(result.name, False, f"{result.message}; hint: {hint}")
    return result


def _ref_layer_comparison(n, d):
    return {"attention": (4 * n * d * d + 2 * n * n * d, 1, 1), "recurrent": (2 * n * d * d, n, n)}


_LAYER_HINTS = {
    ("attention", 0): [(lambda n, d: 2 * n * n * d, "add the four projections to queries, keys, values and the "
                                                    "output, d × d each: 4nd²"),
                       (lambda n, d: 4 * n * d * d + n * n * d, "the weighted sum AV costs n²d multiply-adds as "
                                                                "well as the scores QKᵀ"),
                       (lambda n, d: 3 * n * d * d + 2 * n * n * d, "four projections: W_O as well as W_Q, W_K, W_V"),
                       (lambda n, d: 8 * n * d * d + 4 * n * n * d, "that counts FLOPs (a multiply-add is two); "
                                                                    "the question counts multiply-adds")],
    ("attention", 1): [(lambda n, d: n, "within a layer all n positions are computed at once, in one step (only "
                                        "generation, token by token, is sequential)")],
    ("attention", 2): [(lambda n, d: n, "query n reads key 1 directly: one step, however far apart")],
    ("recurrent", 0): [(lambda n, d: n * d * d, "two products per step: x_t W_x and h_{t-1} W_h, d² each"),
                       (lambda n, d: 2 * (n - 1) * d * d, "count the first step too (h_0 = 0 still goes through "
                                                          "the product, as the question says)"),
                       (lambda n, d: 4 * n * d * d, "that counts FLOPs (a multiply-add is two); the question "
                                                    "counts multiply-adds")],
    ("recurrent", 1): [(lambda n, d: 1, "h_t needs h_{t-1}: the n steps run one after another")],
    ("recurrent", 2): [(lambda n, d: n - 1, "x_1 enters at step 1 and h_n is computed at step n: n steps, counting "
                                            "both ends"),
                       (lambda n, d: 1, "x_1 reaches h_n only through h_2, …, h_{n-1}")],
}
_LAYER_PARTS = ("multiply-adds", "sequential steps", "path length")


def check_layer_comparison(fn) -> CheckResult:
    """``fn(n, d) -> {"attention": (cost, steps, path), "recurrent": (cost, steps, path)}``, ints."""
    cases = [{"n": 4, "d": 2}, {"n": 128, "d": 64}, {"n": 1024, "d": 512}, {"n": 2048, "d": 64}]

    def compare(got, expected):
        if not isinstance(got, dict) or set(got) != set(expected):
            return (f"the answer must be a dict with the keys 'attention' and 'recurrent', got "
                    f"{type(got).__name__}{' with keys ' + str(sorted(got)) if isinstance(got, dict) else ''}")
        for layer, want in expected.items():
            have = got[layer]
            if not isinstance(have, tuple | list) or len(have) != 3:
                return (f"{layer!r} must be a triple (multiply-adds, sequential steps, path length), got "
                        f"{type(have).__name__} {have!r}")
            for i, (h, w) in enumerate(zip(have, want, strict=True)):
                msg = describe_difference(h, w, what=f"{layer} {_LAYER_PARTS[i]}")
                if msg:
                    return msg if "must be an int" in msg else f"{layer} {_LAYER_PARTS[i]}: got {h}, expected {w}"
        return None

    result = check_function("layer_comparison", fn, _ref_layer_comparison, cases, compare=compare)
    if result.passed:
        return result
    for (layer, i), hints in _LAYER_HINTS.items():
        if result.message.startswith(f"{layer} {_LAYER_PARTS[i]}: got"):
            n_case = int(result.message.rsplit("(on case ", 1)[1].split(":")[0])
            n, d = cases[n_case - 1].values()
            got = int(result.message.split(": got ", 1)[1].split(",")[0])
            for wrong, hint in hints:
                if got == wrong(n, d):
                    return CheckResult(result.name, False, f"{result.message}; hint: {hint}")
    return result


def _ref_untrained_rows(table, T_train, n_steps, lr, weight_decay):
    """Rows T_train … T_max - 1 get a zero gradient, so AdamW only decays them: (1 - lr·λ)^n_steps each."""
    return table.double()[T_train:] * (1 - lr * weight_decay) ** n_steps


def check_untrained_rows(fn) -> CheckResult:
    """``fn(table (T_max, d), T_train, n_steps, lr, weight_decay) -> (T_max - T_train, d)``: rows T_train and up,
    decayed by (1 - lr·weight_decay)^n_steps."""
    g = generator(11)
    cases = [{"table": 0.02 * torch.randn(8, 4, generator=g, dtype=torch.float64), "T_train": 5, "n_steps": 20,
              "lr": 1e-2, "weight_decay": 0.1},
             {"table": torch.randn(6, 3, generator=g, dtype=torch.float64), "T_train": 2, "n_steps": 3, "lr": 0.1,
              "weight_decay": 0.5},
             {"table": torch.randn(10, 2, generator=g, dtype=torch.float64), "T_train": 1, "n_steps": 100,
              "lr": 3e-3, "weight_decay": 1.0},
             {"table": torch.randn(4, 2, generator=g, dtype=torch.float64), "T_train": 4, "n_steps": 5, "lr": 0.1,
              "weight_decay": 0.1}]

    def mistakes(table, T_train, n_steps, lr, weight_decay):
        t = table.double()
        return [
            (t[T_train:], "AdamW decays every row, even one with a zero gradient: each step multiplies it by 1 - ηλ"),
            (t[T_train:] * (1 - weight_decay) ** n_steps, "the decoupled decay is scaled by the learning rate: "
                                                          "the factor is 1 - ηλ, not 1 - λ"),
            (t[T_train:] * (1 - n_steps * lr * weight_decay), "the decay compounds: n steps multiply by "
                                                               "(1 - ηλ)^n, not by 1 - nηλ"),
            (t[T_train:] * (1 - lr * weight_decay) ** (n_steps - 1), "count every step: n steps, n factors"),
            (t[T_train - 1:] * (1 - lr * weight_decay) ** n_steps, "a sequence of length T_train reaches rows "
                                                                    "0 … T_train - 1: row T_train - 1 is trained"),
            (t[T_train + 1:] * (1 - lr * weight_decay) ** n_steps, "no sequence of length T_train reaches row "
                                                                    "T_train: it is untrained too"),
            (t[:T_train] * (1 - lr * weight_decay) ** n_steps, "return the rows no training sequence reaches, "
                                                                "T_train and up"),
        ]

    result = check_function("untrained_rows", fn, _ref_untrained_rows, cases, atol=1e-9, rtol=1e-6)
    if result.passed or "(on case " not in result.message:
        return result
    n = int(result.message.rsplit("(on case ", 1)[1].split(":")[0])
    case = cases[n - 1]
    try:
        got = fn(*_copies(case))
        got = torch.as_tensor(got).double()
    except Exception:  # check_function has already reported it
        return result
    for wrong, hint in mistakes(**case):
        if got.shape == wrong.shape and torch.allclose(got, wrong, rtol=1e-6, atol=1e-9):
            return CheckResult(result.name, False, f"{result.message}; hint: {hint}")
    return result


def _copies(case: dict) -> list:
    return [v.clone() if isinstance(v, torch.Tensor) else v for v in case.values()]


EXERCISES = {
    "sinusoidal": check_sinusoidal,
    "rotation_for_offset": check_rotation_for_offset,
    "rope": check_rope,
    "rope_score": check_rope_score,
    "kv_causal_mask": check_kv_causal_mask,
    "kv_pair_count": check_kv_pair_count,
    "alibi": check_alibi,
    "head_splits": check_head_splits,
    "is_equivariant": check_is_equivariant,
    "score_drift": check_score_drift,
    "layer_comparison": check_layer_comparison,
    "untrained_rows": check_untrained_rows,
}
