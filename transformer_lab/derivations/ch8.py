"""Chapter 8 (the mini-GPT): its parameter count and the cost of generation, derived symbolically.

:func:`param_count` adds up the parameters of every part of :class:`transformer_lab.gpt.GPT` as SymPy terms;
:func:`generation_cost` sums the positions a model processes to generate ``n`` tokens with and without a
key/value cache; :func:`half_window_cost` does the same once the window is full and jumps by half a block.
:func:`check` compares the parameter count with our GPT and the reference GPT on random shapes, and both costs
with the same sums done directly in Python.
"""

from __future__ import annotations

import random

import sympy as sp

__all__ = ["check", "generation_cost", "half_window_cost", "param_count", "param_terms"]

V, T, C = sp.symbols("V T C", positive=True, integer=True)
L = sp.Symbol(r"n_\text{layer}", positive=True, integer=True)  # the number of blocks, n_layer
n, t, m, w = sp.symbols("n t m w", positive=True, integer=True)


def param_terms() -> dict[str, sp.Expr]:
    """Parameters of each part, as SymPy expressions in V (vocabulary), T (block size), L = n_layer (blocks), C
    (width)."""
    return {
        "token embedding E (tied to the head)": V * C,
        "learned positions P": T * C,
        "per block: LayerNorm 1 (γ, β)": 2 * C,
        "per block: attention in_proj [W_Q; W_K; W_V] + bias": 3 * C * C + 3 * C,
        "per block: attention out_proj W_O + bias": C * C + C,
        "per block: LayerNorm 2 (γ, β)": 2 * C,
        "per block: MLP fc W₁ + bias": C * 4 * C + 4 * C,
        "per block: MLP proj W₂ + bias": 4 * C * C + C,
        "final LayerNorm": 2 * C,
        "head (= Eᵀ, tied)": sp.Integer(0),
    }


def param_count() -> sp.Expr:
    """N_params(V, T, n_layer, C): the sum of :func:`param_terms`, blocks counted n_layer times, simplified."""
    terms = param_terms()
    per_block = sum(v for k, v in terms.items() if k.startswith("per block"))
    rest = sum(v for k, v in terms.items() if not k.startswith("per block"))
    return sp.expand(rest + L * per_block)  # V C + T C + 2 C + L (12 C² + 13 C)


def generation_cost() -> dict[str, sp.Expr]:
    """The work of generating n tokens from a 1-token prompt, context never full, counted two ways.

    Positions (projections, MLP: the per-position work): without a cache step t recomputes all t positions,
    Σ_{t=1}^{n} t = n(n+1)/2; with a cache it processes the one new position, n in all; ratio (n+1)/2.
    Attention pairs (query i, key j ≤ i): without a cache step t scores t(t+1)/2 pairs, Σ = n(n+1)(n+2)/6; with a
    cache the one new query scores all t keys, Σ t = n(n+1)/2: still quadratic in n, and O(t) per token.
    """
    without = sp.summation(t, (t, 1, n))
    with_cache = sp.summation(sp.Integer(1), (t, 1, n))
    pairs_without = sp.summation(t * (t + 1) / 2, (t, 1, n))
    pairs_with = sp.summation(t, (t, 1, n))
    return {"without": sp.factor(without), "with_cache": with_cache, "ratio": sp.simplify(without / with_cache),
            "pairs_without": sp.factor(pairs_without), "pairs_with_cache": sp.factor(pairs_with),
            "pairs_ratio": sp.simplify(pairs_without / pairs_with)}


def half_window_cost() -> dict[str, sp.Expr]:
    """Positions per step once the context is full, with ``generate(window="half")`` and block size T = 2m.

    One cycle lasts m steps: the window grows from m + 1 to 2m tokens, then jumps forward by m. Without a cache
    each step recomputes its whole window, Σ_{w=m+1}^{2m} w; with a cache the jump re-fills m + 1 positions once
    and the other m - 1 steps process one position each, 2m in all. The ratio is (3T + 2)/8, about 3T/8: half
    the mean window 3T/4, because the re-fill doubles the cached path's work.
    """
    without = sp.summation(w, (w, m + 1, 2 * m))
    with_cache = (m + 1) + (m - 1)
    ratio = sp.simplify((without / with_cache).subs(m, T / 2))
    return {"without": sp.factor(without.subs(m, T / 2)), "with_cache": sp.simplify(with_cache.subs(m, T / 2)),
            "ratio": sp.factor(ratio), "mean_window": sp.simplify((without / m).subs(m, T / 2))}


def check(seed: int = 0) -> dict[str, float]:
    """Largest |difference| between the formula, our GPT's count and the reference GPT's, over random shapes; and
    between each generation cost and its sum done directly in Python (``window="half"``: one cycle, by its rule)."""
    from transformer_lab.gpt import GPT, GPTConfig
    from transformer_lab.reference import ReferenceGPT

    rng = random.Random(seed)
    f = sp.lambdify((V, T, L, C), param_count())
    worst_ours = worst_ref = 0
    for _ in range(3):
        v, tt, layers, h = rng.randint(5, 70), rng.randint(4, 64), rng.randint(1, 3), rng.choice([1, 2, 4])
        c = h * rng.randint(2, 8)
        config = GPTConfig(vocab_size=v, block_size=tt, n_layer=layers, n_head=h, d_model=c)
        ours = GPT(config).num_params()
        ref = sum(p.numel() for p in ReferenceGPT(config).parameters())  # parameters() lists a tied one once
        worst_ours = max(worst_ours, abs(int(f(v, tt, layers, c)) - ours))
        worst_ref = max(worst_ref, abs(ours - ref))
    cost = generation_cost()
    ratio_err = max(abs(float(cost["ratio"].subs(n, k)) - sum(range(1, k + 1)) / k) for k in (1, 7, 500))
    pairs_err = max(abs(int(cost["pairs_without"].subs(n, k)) - sum(s * (s + 1) // 2 for s in range(1, k + 1)))
                    + abs(int(cost["pairs_with_cache"].subs(n, k)) - sum(range(1, k + 1))) for k in (1, 7, 500))
    half = half_window_cost()
    half_err = 0.0
    for block in (2, 4, 32, 256):  # even block sizes T = 2m
        m_ = block // 2
        without = sum(range(m_ + 1, block + 1))  # each step of a cycle recomputes its window of m+1 .. 2m tokens
        with_cache = (m_ + 1) + (m_ - 1)  # one re-fill of m + 1 positions, then m - 1 single positions
        half_err = max(half_err, abs(int(half["without"].subs(T, block)) - without)
                       + abs(int(half["with_cache"].subs(T, block)) - with_cache)
                       + abs(float(half["ratio"].subs(T, block)) - without / with_cache))
    return {"formula vs ours": float(worst_ours), "ours vs reference": float(worst_ref),
            "cache ratio vs direct sum": ratio_err, "attention pairs vs direct sum": float(pairs_err),
            "half-window cycle vs direct sum": half_err}
