"""Chapter 8 exercise checkers and derivations: solutions pass, the typical wrong answers of CATALOGUE fail with a
message naming the difference, correct answers written another way pass; the parameter-count formula equals both
models' counts."""

import copy
import itertools
import math

import numpy as np
import pytest
import sympy as sp
import torch
import torch.nn.functional as F
from conftest import assert_accepted, assert_rejected, right_answers, wrong_answers

from transformer_lab import ladder, lens
from transformer_lab.data import CharTokenizer
from transformer_lab.derivations import ch8 as d8
from transformer_lab.exercises import ch8, registry
from transformer_lab.gpt import GPT, GPTConfig


def count_params(vocab_size, block_size, n_layer, d_model):
    C = d_model
    return vocab_size * C + block_size * C + n_layer * (12 * C * C + 13 * C) + 2 * C


def lm_windows(ids, block_size):
    n = (len(ids) - 1) // block_size
    x = ids[: n * block_size].view(n, block_size)
    y = ids[1: n * block_size + 1].view(n, block_size)
    return x, y


def attend_with_cache(q, k_cache, v_cache, k_new, v_new):
    k = torch.cat((k_cache, k_new), dim=-2)
    v = torch.cat((v_cache, v_new), dim=-2)
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return w @ v, k, v


def same_function(a, b):
    if a.shape != b.shape:
        return False
    scale = max(1.0, b.abs().max().item())
    return (a - b).abs().max().item() <= 1000 * torch.finfo(b.dtype).eps * scale


def ladder_gains(rungs):
    loss = {r["name"]: r["val_loss"] for r in rungs}
    gains = {r["name"]: loss[r["parent"]] - r["val_loss"] for r in rungs if r["parent"] is not None}
    return {name: (nats, nats / math.log(2)) for name, nats in gains.items()}


def logit_lens(x, ln_weight, ln_bias, emb):
    return F.layer_norm(x, x.shape[-1:], ln_weight, ln_bias, eps=1e-5) @ emb.T


def next_char_probs(logits, temperature, top_k, top_p):
    z = logits / temperature
    if top_k is not None:
        z = z.masked_fill(z < torch.topk(z, top_k, dim=-1).values[..., -1:], float("-inf"))
    p = torch.softmax(z, -1)
    if top_p is not None:
        sorted_p, order = torch.sort(p, dim=-1, descending=True)
        drop = (torch.cumsum(sorted_p, -1) - sorted_p) >= top_p
        p = p.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), 0.0)
    return p / p.sum(-1, keepdim=True)


def checkpoint(state):
    return {k: state[k].clone() if isinstance(state[k], torch.Tensor) else state[k]
            for k in ("params", "velocity", "step", "rng")}


# ---------------------------------------------------------------- count_params
def _count_by_parts(vocab_size, block_size, n_layer, d_model):
    C = d_model
    linear = {"in_proj": (C, 3 * C), "out_proj": (C, C), "fc": (C, 4 * C), "proj": (4 * C, C)}
    per_block = sum(i * o + o for i, o in linear.values()) + 2 * (2 * C)  # weights, biases, two LayerNorms
    return vocab_size * C + block_size * C + sum(per_block for _ in range(n_layer)) + 2 * C


def _count_numpy(vocab_size, block_size, n_layer, d_model):
    C = np.int64(d_model)
    return int((vocab_size + block_size + 2) * C + n_layer * C * (12 * C + 13))


def _count_head_twice(vocab_size, block_size, n_layer, d_model):
    return count_params(vocab_size, block_size, n_layer, d_model) + vocab_size * d_model


def _count_no_biases(vocab_size, block_size, n_layer, d_model):
    return count_params(vocab_size, block_size, n_layer, d_model) - n_layer * 13 * d_model


def _count_no_positions(vocab_size, block_size, n_layer, d_model):
    return count_params(vocab_size, block_size, n_layer, d_model) - block_size * d_model


def _count_mlp_not_widened(vocab_size, block_size, n_layer, d_model):
    C = d_model  # hidden layer of width C instead of 4C
    return vocab_size * C + block_size * C + n_layer * (6 * C * C + 10 * C) + 2 * C


def _count_float(vocab_size, block_size, n_layer, d_model):
    return count_params(vocab_size, block_size, n_layer, d_model) / 1


def _count_no_final_layernorm(vocab_size, block_size, n_layer, d_model):
    return count_params(vocab_size, block_size, n_layer, d_model) - 2 * d_model


def _count_no_block_layernorms(vocab_size, block_size, n_layer, d_model):
    return count_params(vocab_size, block_size, n_layer, d_model) - n_layer * 4 * d_model


def _count_sympy(vocab_size, block_size, n_layer, d_model):  # the right number, as a SymPy Integer
    return sp.Integer(count_params(vocab_size, block_size, n_layer, d_model))


def _count_sympy_wrong(vocab_size, block_size, n_layer, d_model):  # a SymPy Integer, and the head counted twice
    return sp.Integer(_count_head_twice(vocab_size, block_size, n_layer, d_model))


def _count_tensor(vocab_size, block_size, n_layer, d_model):  # the right number, as a 0-d integer tensor
    return torch.tensor(count_params(vocab_size, block_size, n_layer, d_model))


# ---------------------------------------------------------------- lm_windows
def _windows_by_index(ids, block_size):
    n = (len(ids) - 1) // block_size
    starts = torch.arange(n)[:, None] * block_size + torch.arange(block_size)
    return ids[starts], ids[starts + 1]


def _windows_unfold(ids, block_size):
    n = (len(ids) - 1) // block_size
    x = ids.unfold(0, block_size, block_size)[:n]
    y = ids[1:].unfold(0, block_size, block_size)[:n]
    return x, y


def _windows_len_over_T(ids, block_size):  # the off-by-one: N = len // T
    n = len(ids) // block_size
    return ids[: n * block_size].view(n, block_size), ids[1: n * block_size + 1].view(n, block_size)


def _windows_len_over_T_indexed(ids, block_size):  # the same off-by-one, written without .view
    n = len(ids) // block_size
    starts = torch.arange(n)[:, None] * block_size + torch.arange(block_size)
    return ids[starts], ids[(starts + 1).clamp(max=len(ids) - 1)]


def _windows_ceil(ids, block_size):  # N = ceil((len - 1) / T): the last window runs past the end
    n = -(-(len(ids) - 1) // block_size)
    starts = torch.arange(n)[:, None] * block_size + torch.arange(block_size)
    return ids[starts.clamp(max=len(ids) - 2)], ids[(starts + 1).clamp(max=len(ids) - 1)]


def _windows_not_shifted(ids, block_size):
    x, _ = lm_windows(ids, block_size)
    return x, x


def _windows_one_short(ids, block_size):
    return tuple(t[:-1] for t in lm_windows(ids, block_size))


def _windows_overlapping(ids, block_size):  # a window at every position
    return ids[:-1].unfold(0, block_size, 1), ids[1:].unfold(0, block_size, 1)


def _windows_swapped(ids, block_size):
    x, y = lm_windows(ids, block_size)
    return y, x


# ---------------------------------------------------------------- attend_with_cache
def _cache_sdpa(q, k_cache, v_cache, k_new, v_new):
    k, v = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
    return F.scaled_dot_product_attention(q, k, v), k, v


def _cache_einsum(q, k_cache, v_cache, k_new, v_new):
    k, v = torch.cat([k_cache, k_new], dim=2), torch.cat([v_cache, v_new], dim=2)
    s = torch.einsum("bhqd,bhkd->bhqk", q, k) * q.shape[-1] ** -0.5
    p = torch.exp(s - s.amax(-1, keepdim=True))
    return torch.einsum("bhqk,bhkd->bhqd", p / p.sum(-1, keepdim=True), v), k, v


def _cache_only_out(q, k_cache, v_cache, k_new, v_new):
    return attend_with_cache(q, k_cache, v_cache, k_new, v_new)[:1]


def _cache_no_scale(q, k_cache, v_cache, k_new, v_new):
    k, v = torch.cat((k_cache, k_new), -2), torch.cat((v_cache, v_new), -2)
    return torch.softmax(q @ k.transpose(-2, -1), -1) @ v, k, v


def _cache_scale_by_d(q, k_cache, v_cache, k_new, v_new):
    k, v = torch.cat((k_cache, k_new), -2), torch.cat((v_cache, v_new), -2)
    return torch.softmax(q @ k.transpose(-2, -1) / q.shape[-1], -1) @ v, k, v


def _cache_softmax_wrong_dim(q, k_cache, v_cache, k_new, v_new):
    k, v = torch.cat((k_cache, k_new), -2), torch.cat((v_cache, v_new), -2)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-2) @ v, k, v


def _cache_new_first(q, k_cache, v_cache, k_new, v_new):
    k, v = torch.cat((k_new, k_cache), -2), torch.cat((v_new, v_cache), -2)
    w = torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return w @ v, k, v


def _cache_sdpa_is_causal(q, k_cache, v_cache, k_new, v_new):  # top-left causal mask: the query sees key 0 only
    k, v = torch.cat([k_cache, k_new], -2), torch.cat([v_cache, v_new], -2)
    return F.scaled_dot_product_attention(q, k, v, is_causal=True), k, v


def _cache_tril_mask(q, k_cache, v_cache, k_new, v_new):  # the same mistake, by hand
    k, v = torch.cat((k_cache, k_new), -2), torch.cat((v_cache, v_new), -2)
    s = q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1])
    s = s.masked_fill(~torch.ones(s.shape[-2:], dtype=torch.bool).tril(), float("-inf"))
    return torch.softmax(s, -1) @ v, k, v


def _cache_naive_softmax(q, k_cache, v_cache, k_new, v_new):  # exp without subtracting the maximum
    k, v = torch.cat((k_cache, k_new), -2), torch.cat((v_cache, v_new), -2)
    e = torch.exp(q @ k.transpose(-2, -1) / math.sqrt(q.shape[-1]))
    return e / e.sum(-1, keepdim=True) @ v, k, v


def _cache_scale_by_dv(q, k_cache, v_cache, k_new, v_new):  # 1/sqrt of the values' width, not the query's
    k, v = torch.cat((k_cache, k_new), -2), torch.cat((v_cache, v_new), -2)
    return torch.softmax(q @ k.transpose(-2, -1) / math.sqrt(v.shape[-1]), -1) @ v, k, v


def _cache_new_token_ignored(q, k_cache, v_cache, k_new, v_new):
    k, v = torch.cat((k_cache, k_new), -2), torch.cat((v_cache, v_new), -2)
    w = torch.softmax(q @ k[..., :-1, :].transpose(-2, -1) / math.sqrt(q.shape[-1]), dim=-1)
    return w @ v[..., :-1, :], k, v


def _cache_float32(q, k_cache, v_cache, k_new, v_new):  # computed in float32: used to crash the checker
    q, k_cache, v_cache, k_new, v_new = (x.float() for x in (q, k_cache, v_cache, k_new, v_new))
    return attend_with_cache(q, k_cache, v_cache, k_new, v_new)


def _cache_float32_cast_back(q, k_cache, v_cache, k_new, v_new):  # float32 inside, float64 returned
    return tuple(x.double() for x in _cache_float32(q, k_cache, v_cache, k_new, v_new))


def _cache_float32_out_only(q, k_cache, v_cache, k_new, v_new):  # the caches stay float64, the output does not
    k, v = torch.cat((k_cache, k_new), -2), torch.cat((v_cache, v_new), -2)
    w = torch.softmax(q.float() @ k.float().transpose(-2, -1) / math.sqrt(q.shape[-1]), -1)
    return w @ v.float(), k, v


# ---------------------------------------------------------------- attention_entropy
def attention_entropy(w):
    return -(w * torch.log(w.clamp(min=1e-300))).sum(-1)  # w ln w -> 0 at w = 0; clamp keeps log finite


def _entropy_xlogy(w):
    return -torch.special.xlogy(w, w).sum(dim=-1)


def _entropy_where(w):
    logs = torch.where(w > 0, w.log(), torch.zeros_like(w))
    return (-w * logs).sum(-1)


def _entropy_naive(w):  # 0 · ln 0 = 0 · (-inf) = NaN
    return -(w * w.log()).sum(-1)


def _entropy_bits(w):
    return -torch.special.xlogy(w, w).sum(-1) / math.log(2)


def _entropy_no_minus(w):
    return torch.special.xlogy(w, w).sum(-1)


def _entropy_wrong_dim(w):
    return -torch.special.xlogy(w, w).sum(-2)


def _entropy_float32(w):  # computed in float32: used to get only "got 1.22336376, expected 1.2233638"
    return -torch.special.xlogy(w.float(), w.float()).sum(-1)


def _entropy_mean(w):
    return -torch.special.xlogy(w, w).mean(-1)


# ---------------------------------------------------------------- same_function
def _same_allclose(a, b):  # the same test with torch.allclose, its tolerances set from the dtype
    eps = torch.finfo(a.dtype).eps
    return a.shape == b.shape and torch.allclose(a, b, rtol=0, atol=1000 * eps * max(1.0, float(b.abs().max())))


def _same_numpy(a, b):
    a, b = a.numpy(), b.numpy()
    if a.shape != b.shape:
        return False
    return bool(np.max(np.abs(a - b)) <= 500 * np.finfo(b.dtype).eps * max(1.0, np.max(np.abs(b))))


def _same_eps_tolerance(a, b, k):  # a tolerance of k ε times the logits' scale
    return a.shape == b.shape and bool((a - b).abs().max() <= k * torch.finfo(b.dtype).eps * max(1.0, b.abs().max()))


def _same_bitwise(a, b):  # too strict: round-off is a difference
    return torch.equal(a, b)


def _same_default_allclose(a, b):  # too loose in float64: rtol = 1e-5 hides a small bug
    return a.shape == b.shape and torch.allclose(a, b)


def _same_argmax(a, b):  # what a sampled / greedy text compares
    return a.shape == b.shape and torch.equal(a.argmax(-1), b.argmax(-1))


def _same_fixed_atol(a, b):
    return a.shape == b.shape and bool((a - b).abs().max() < 1e-6)


def _same_float64_eps_always(a, b):  # float64's epsilon for float32 logits too
    return a.shape == b.shape and bool((a - b).abs().max() <= 1000 * torch.finfo(torch.float64).eps)


def _same_no_shape_check(a, b):  # broadcasting fails on different shapes
    return bool((a - b).abs().max() <= 1000 * torch.finfo(b.dtype).eps)


def _same_tolerance_1e_9(a, b):  # a float64 habit, applied to float32 logits
    return a.shape == b.shape and torch.allclose(a, b, rtol=1e-9, atol=1e-9)


def _same_tensor_answer(a, b):  # a tensor of verdicts, one per logit
    return (a - b).abs() <= 1e-9


# ---------------------------------------------------------------- ladder_gains
def _gains_loop(rungs):
    by_name = {r["name"]: r for r in rungs}
    out = {}
    for r in rungs:
        if r["parent"]:
            drop = by_name[r["parent"]]["val_loss"] - r["val_loss"]
            out[r["name"]] = [drop, math.log2(math.exp(drop))]
    return out


def _gains_numpy(rungs):
    names = [r["name"] for r in rungs if r["parent"] is not None]
    loss = {r["name"]: r["val_loss"] for r in rungs}
    nats = np.array([loss[next(r["parent"] for r in rungs if r["name"] == n)] - loss[n] for n in names])
    return {n: (float(a), float(b)) for n, a, b in zip(names, nats, nats * math.log2(math.e), strict=True)}


def _gains_row_above(rungs):  # each rung against the row above it, not its parent
    return {r["name"]: (q["val_loss"] - r["val_loss"], (q["val_loss"] - r["val_loss"]) / math.log(2))
            for q, r in itertools.pairwise(rungs)}


def _gains_sign(rungs):
    return {k: (-n, -b) for k, (n, b) in ladder_gains(rungs).items()}


def _gains_bits_times_ln2(rungs):
    return {k: (n, n * math.log(2)) for k, (n, _) in ladder_gains(rungs).items()}


def _gains_log10(rungs):
    return {k: (n, n / math.log(10)) for k, (n, _) in ladder_gains(rungs).items()}


def _gains_root_included(rungs):
    return {rungs[0]["name"]: (0.0, 0.0), **ladder_gains(rungs)}


def _gains_relative(rungs):
    loss = {r["name"]: r["val_loss"] for r in rungs}
    return {r["name"]: ((loss[r["parent"]] - r["val_loss"]) / loss[r["parent"]],
                        (loss[r["parent"]] - r["val_loss"]) / loss[r["parent"]] / math.log(2))
            for r in rungs if r["parent"] is not None}


def _gains_list(rungs):  # the numbers, but not keyed by rung
    return list(ladder_gains(rungs).values())


# ---------------------------------------------------------------- next_char_probs
def _probs_loop(logits, temperature, top_k, top_p):
    """Row by row, in plain Python over a sorted list: another style than the solution's."""
    out = torch.zeros_like(logits)
    flat, rows = logits.reshape(-1, logits.shape[-1]), out.view(-1, logits.shape[-1])
    for r, z in enumerate(flat):
        ranked = sorted(range(len(z)), key=lambda i: -float(z[i]))
        kept = ranked[:top_k] if top_k is not None else ranked
        w = [math.exp((float(z[i]) - float(z[ranked[0]])) / temperature) for i in kept]
        total, mass, nucleus = sum(w), 0.0, []
        for i, wi in zip(kept, w, strict=True):
            if top_p is not None and mass >= top_p:
                break
            nucleus.append((i, wi))
            mass += wi / total
        norm = sum(wi for _, wi in nucleus)
        for i, wi in nucleus:
            rows[r, i] = wi / norm
    return out


def _probs_library(logits, temperature, top_k, top_p):
    from transformer_lab.sampling import filter_logits
    return torch.softmax(filter_logits(logits, temperature=temperature, top_k=top_k, top_p=top_p), -1)


def _probs_times_tau(logits, temperature, top_k, top_p):
    return next_char_probs(logits * temperature * temperature, temperature, top_k, top_p)


def _probs_nucleus_shifted(shifts, keep_first=True):
    """next_char_probs whose top-p drop mask (cumsum > p) is shifted right ``shifts`` times: 0 drops the token that
    crosses p (one token too few), 1 is right, 2 keeps the token after it too (one token too many);
    ``keep_first=False``: the top token is not kept whatever the mask says (an empty row gives NaN)."""
    def probs(logits, temperature, top_k, top_p):
        z = logits / temperature
        if top_k is not None:
            z = z.masked_fill(z < torch.topk(z, top_k, dim=-1).values[..., -1:], float("-inf"))
        p = torch.softmax(z, -1)
        if top_p is not None:
            sorted_p, order = torch.sort(p, dim=-1, descending=True)
            drop = torch.cumsum(sorted_p, -1) > top_p
            for _ in range(shifts):
                drop[..., 1:] = drop[..., :-1].clone()
                drop[..., 0] = False
            if keep_first:
                drop[..., 0] = False
            p = p.masked_fill(torch.zeros_like(drop).scatter(-1, order, drop), 0.0)
        return p / p.sum(-1, keepdim=True)
    return probs


def _probs_not_renormalised(logits, temperature, top_k, top_p):
    p = next_char_probs(logits, temperature, top_k, top_p)
    return p * torch.softmax(logits / temperature, -1).where(p > 0, 0).sum(-1, keepdim=True)


def _probs_top_p_first(logits, temperature, top_k, top_p):
    keep = next_char_probs(logits, 1.0, top_k, top_p) > 0
    p = torch.softmax(logits / temperature, -1) * keep
    return p / p.sum(-1, keepdim=True)


def _probs_top_k_plus_one(logits, temperature, top_k, top_p):
    return next_char_probs(logits, temperature, None if top_k is None else top_k + 1, top_p)


def _probs_logits(logits, temperature, top_k, top_p):
    return next_char_probs(logits, temperature, top_k, top_p).log()


# ---------------------------------------------------------------- logit_lens
def _lens_by_hand(x, ln_weight, ln_bias, emb):
    mu = x.mean(-1, keepdim=True)
    var = ((x - mu) ** 2).mean(-1, keepdim=True)
    return ((x - mu) / torch.sqrt(var + 1e-5) * ln_weight + ln_bias) @ emb.T


def _lens_einsum(x, ln_weight, ln_bias, emb):
    ln = torch.nn.LayerNorm(x.shape[-1], dtype=x.dtype)
    with torch.no_grad():
        ln.weight.copy_(ln_weight)
        ln.bias.copy_(ln_bias)
        return torch.einsum("...c,vc->...v", ln(x), emb)


def _lens_no_layernorm(x, ln_weight, ln_bias, emb):
    return x @ emb.T


def _lens_no_affine(x, ln_weight, ln_bias, emb):
    return F.layer_norm(x, x.shape[-1:], eps=1e-5) @ emb.T


def _lens_unbiased(x, ln_weight, ln_bias, emb):
    return ((x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + 1e-5) * ln_weight + ln_bias) @ emb.T


def _lens_no_eps(x, ln_weight, ln_bias, emb):
    return F.layer_norm(x, x.shape[-1:], ln_weight, ln_bias, eps=0.0) @ emb.T


def _lens_softmax(x, ln_weight, ln_bias, emb):
    return torch.softmax(logit_lens(x, ln_weight, ln_bias, emb), -1)


def _lens_float32(x, ln_weight, ln_bias, emb):
    return logit_lens(x.float(), ln_weight.float(), ln_bias.float(), emb.float())


def _lens_untransposed(x, ln_weight, ln_bias, emb):
    return F.layer_norm(x, x.shape[-1:], ln_weight, ln_bias, eps=1e-5) @ emb


# ---------------------------------------------------------------- checkpoint
def _checkpoint_everything(state):
    return copy.deepcopy(state)


def _checkpoint_loop(state):
    saved = {}
    for name in ("params", "velocity", "rng"):
        saved[name] = torch.empty_like(state[name]).copy_(state[name])
    saved["step"] = int(state["step"])
    return saved


def _checkpoint_without(*left_out):
    def answer(state):
        return {k: v for k, v in checkpoint(state).items() if k not in left_out}
    return answer


def _checkpoint_aliased(state):  # the loop's own tensors, which the next steps update in place
    return dict(state)


def _checkpoint_as_list(state):
    return list(checkpoint(state).values())


def _checkpoint_renamed(state):
    return {"weights" if k == "params" else k: v for k, v in checkpoint(state).items()}


def _checkpoint_params_as_list(state):
    return dict(checkpoint(state), params=state["params"].tolist())



# ---------------------------------------------------------------- ngram_place
def ngram_place(loss, baselines):
    bits = loss / math.log(2)
    beaten = max((n for n, b in baselines.items() if bits < b), default=0)
    return beaten, (bits - baselines[beaten + 1] if beaten + 1 in baselines else None)


def _place_loop(loss, baselines):  # walk the orders upwards until one is not beaten
    bits, order = loss * math.log2(math.e), 0
    for n in sorted(baselines):
        if bits >= baselines[n]:
            return order, bits - baselines[n]
        order = n
    return order, None


def _place_nats(loss, baselines):  # the loss left in nats
    beaten = max((n for n, b in baselines.items() if loss < b), default=0)
    return beaten, (loss - baselines[beaten + 1] if beaten + 1 in baselines else None)


def _place_times_ln2(loss, baselines):
    return ngram_place(loss * math.log(2) ** 2, baselines)


def _place_log10(loss, baselines):
    return ngram_place(loss / math.log(10) * math.log(2), baselines)


def _place_first_unbeaten(loss, baselines):
    order, gap = ngram_place(loss, baselines)
    return order + 1, gap


def _place_gap_reversed(loss, baselines):
    order, gap = ngram_place(loss, baselines)
    return order, None if gap is None else -gap


def _place_gap_in_nats(loss, baselines):
    order, gap = ngram_place(loss, baselines)
    return order, None if gap is None else gap * math.log(2)


def _place_float_order(loss, baselines):
    order, gap = ngram_place(loss, baselines)
    return float(order), gap

CATALOGUE = {
    "count_params": {
        "wrong": [
            (_count_head_twice, ["count is", "expected", "count the V × C matrix once"]),
            (_count_no_biases, ["count is", "expected", "13C per block"]),
            (_count_no_positions, ["count is", "expected", "position table"]),
            (_count_mlp_not_widened, ["count is", "expected", "4C wide"]),
            (_count_float, ["must be an int", "use // or int()"]),
            (_count_no_final_layernorm, ["count is", "(-256)", "final LayerNorm"]),
            (_count_no_block_layernorms, ["count is", "two LayerNorms"]),  # -2C on the first case, C = 128
            (_count_sympy, ["must be an int", "Integer 809728", "convert it with int()"]),
            (_count_tensor, ["must be an int", "convert it with int()"]),
            (_count_sympy_wrong, ["must be an int", "which is 817920 (+8192), expected 809728"]),
        ],
        "right": [_count_by_parts, _count_numpy],
    },
    "lm_windows": {
        "wrong": [
            (_windows_len_over_T, ["on case 5", "N = (len - 1) // T: the last window needs one more token"]),
            (_windows_len_over_T_indexed, ["output[0] has shape (3, 4), expected (2, 4)",
                                          "12 tokens give 2 windows whose targets all exist; you made 3"]),
            (_windows_ceil, ["on case 5", "N = (len - 1) // T", "you made 3"]),
            (_windows_not_shifted, ["output[1] differs", "entries"]),
            (_windows_one_short, ["has shape"]),
            (_windows_overlapping, ["output[0] has shape"]),
            (_windows_swapped, ["output[0] differs"]),
        ],
        "right": [_windows_by_index, _windows_unfold],
    },
    "attend_with_cache": {
        "wrong": [
            (_cache_only_out, ["should have 3 items"]),
            (_cache_no_scale, ["output[0] differs"]),
            (_cache_scale_by_d, ["output[0] differs"]),
            (_cache_softmax_wrong_dim, ["output[0] differs"]),
            (_cache_new_first, ["output[1] differs"]),  # attention ignores order: the out agrees, the cache not
            (_cache_new_token_ignored, ["output[0]"]),
            (_cache_sdpa_is_causal, ["on case 1", "first value only", "is_causal=True", "no mask is needed"]),
            (_cache_tril_mask, ["on case 1", "first value only", "no mask is needed"]),
            (_cache_naive_softmax, ["on case 4", "not finite", "subtract each row's maximum"]),
            (_cache_scale_by_dv, ["output[0] differs", "on case 2"]),
            (_cache_float32, ["output[0] has dtype torch.float32, expected torch.float64", "compute in the inputs'"]),
            (_cache_float32_out_only, ["output[0] has dtype torch.float32", "compute in the inputs' dtype"]),
            (_cache_float32_cast_back, ["output[0] differs", "float32's round-off", "compute in float64 throughout"]),
        ],
        "right": [_cache_sdpa, _cache_einsum],
    },
    "attention_entropy": {
        "wrong": [
            (_entropy_naive, ["NaN", "0 · ln 0", "xlogy"]),
            (_entropy_bits, ["differs", "bits"]),
            (_entropy_no_minus, ["differs", "the sign"]),
            (_entropy_wrong_dim, ["differs"]),
            (_entropy_mean, ["differs"]),
            (_entropy_float32, ["dtype torch.float32", "float64", "rounds to float32"]),
        ],
        "right": [_entropy_xlogy, _entropy_where],
    },
    "same_function": {
        "wrong": [
            (_same_bitwise, ["on case 1", "answered False, expected True", "round-off", "torch.finfo(dtype).eps"]),
            (_same_default_allclose, ["on case 3", "answered True, expected False", "in float32",
                                      "allclose's default"]),
            (_same_argmax, ["on case 3", "answered True"]),
            (_same_fixed_atol, ["on case 3", "answered True", "fixed tolerance"]),
            (_same_float64_eps_always, ["on case 2", "answered False", "float32"]),
            (_same_no_shape_check, ["on case 6", "raised RuntimeError"]),
            (_same_tolerance_1e_9, ["on case 2", "answered False"]),
            (_same_tensor_answer, ["on case 1", "one bool", "got Tensor"]),
            (lambda a, b: _same_eps_tolerance(a, b, 1e5), ["on case 8", "answered True, expected False",
                                                          "0.797884561, 9 digits", "tiny real bug", "no more"]),
            (lambda a, b: _same_eps_tolerance(a, b, 1e6), ["on case 8", "answered True"]),  # 10⁶ ε: far too loose
            (lambda a, b: a.shape == b.shape and torch.allclose(
                a, b, rtol=0, atol=1e-10 if a.dtype == torch.float64 else 1e-6),
             ["on case 8", "answered True", "loose tolerance (1e-10"]),  # a fixed atol per dtype: 1e-10 in float64
            (lambda a, b: _same_eps_tolerance(a, b, 2), ["on case 7", "answered False, expected True",
                                                        "too strict"]),  # round-off of one or two ε only
        ],
        "right": [_same_allclose, _same_numpy, lambda a, b: _same_eps_tolerance(a, b, 300)],
    },
    "ladder_gains": {
        "wrong": [
            (_gains_row_above, ["on case 1", "answer['sinusoidal']", "its parent", "not with the row above"]),
            (_gains_sign, ["differs", "the sign"]),
            (_gains_bits_times_ln2, ["answer['attention'][1] differs", "nats / ln 2", "not nats · ln 2"]),
            (_gains_log10, ["[1] differs", "not by ln 10"]),
            (_gains_root_included, ["rungs ['bigram'] it should not", "only rungs with a parent"]),
            (_gains_relative, ["differs", "not a fraction of the parent's loss"]),
            (_gains_list, ["should be a dict", "got list"]),
        ],
        "right": [_gains_loop, _gains_numpy],
    },
    "logit_lens": {
        "wrong": [
            (_lens_no_layernorm, ["differs", "final LayerNorm LN_f"]),
            (_lens_no_affine, ["differs", "scale γ and shift β"]),
            (_lens_unbiased, ["differs", "population variance"]),
            (_lens_no_eps, ["differs", "inside the square root"]),
            (_lens_softmax, ["differs", "not their softmax"]),
            (_lens_float32, ["dtype torch.float32", "rounds to float32"]),
            (_lens_untransposed, ["raised RuntimeError"]),
        ],
        "right": [_lens_by_hand, _lens_einsum],
    },
    "checkpoint": {
        "wrong": [
            (_checkpoint_without("velocity"), ["on case 1", "misses ['velocity']", "momentum buffer"]),
            (_checkpoint_without("step"), ["misses ['step']", "warm-up learning rate", "step 0"]),
            (_checkpoint_without("rng"), ["misses ['rng']", "generator's state", "batches and dropout masks"]),
            (_checkpoint_without("params"), ["misses ['params']", "initial weights"]),
            (_checkpoint_without("velocity", "rng"), ["misses ['velocity', 'rng']", "momentum", "generator"]),
            (_checkpoint_aliased, ["checkpoint['params'] changed after checkpoint returned", ".clone()"]),
            (_checkpoint_as_list, ["should be a dict", "got list"]),
            (_checkpoint_renamed, ["entries ['weights'] the loop state does not"]),
            (_checkpoint_params_as_list, ["checkpoint['params'] should be a tensor, got list"]),
        ],
        "right": [_checkpoint_everything, _checkpoint_loop],
    },
    "ngram_place": {
        "wrong": [
            (_place_nats, ["on case", "divide the loss by ln 2"]),
            (_place_times_ln2, ["not nats · ln 2"]),
            (_place_log10, ["not by ln 10"]),
            (_place_first_unbeaten, ["order is 1, expected 0", "largest n whose baseline the model beats"]),
            (_place_gap_reversed, ["gap", "a positive number"]),
            (_place_gap_in_nats, ["gap", "in bits per character"]),
            (_place_float_order, ["order must be an int, got float"]),
        ],
        "right": [ngram_place, _place_loop],
    },
    "next_char_probs": {
        "wrong": [
            (_probs_times_tau, ["on case 1", "differs", "do not multiply"]),
            (_probs_nucleus_shifted(0), ["differs", "one token too small", "the token that crosses p is kept",
                                     "!too large"]),
            (_probs_nucleus_shifted(0, keep_first=False), ["one token too small", "lost every token", "NaN"]),
            (_probs_nucleus_shifted(2), ["on case 1", "differs", "one token too large", "!too small"]),
            (_probs_not_renormalised, ["differs", "renormalise"]),
            (_probs_top_p_first, ["on case 1", "differs", "apply the temperature first"]),
            (_probs_top_k_plus_one, ["on case 2", "differs", "exactly k = 4 here, not 5"]),
            (_probs_logits, ["on case 1", "not logits or log-probabilities"]),
        ],
        "right": [_probs_loop, _probs_library],
    },
}


def test_registry():
    assert registry(8) == ch8.EXERCISES
    assert set(ch8.EXERCISES) == {"count_params", "lm_windows", "attend_with_cache", "attention_entropy",
                                  "same_function", "ladder_gains", "logit_lens", "checkpoint", "ngram_place",
                                  "next_char_probs"}


@pytest.mark.parametrize("fn", [count_params, lm_windows, attend_with_cache, attention_entropy, same_function,
                                ladder_gains, logit_lens, checkpoint, ngram_place,
                                next_char_probs])
def test_solutions_pass(fn):
    result = ch8.EXERCISES[fn.__name__](fn)
    assert result.passed, result.message


@pytest.mark.parametrize(("name", "wrong", "words"), wrong_answers(CATALOGUE))
def test_typical_wrong_answer_rejected(name, wrong, words):
    assert_rejected(ch8.EXERCISES[name], wrong, *words)


@pytest.mark.parametrize(("name", "right"), right_answers(CATALOGUE))
def test_correct_alternative_accepted(name, right):
    assert_accepted(ch8.EXERCISES[name], right)


def test_stub_says_not_written():
    def count_params(vocab_size, block_size, n_layer, d_model):
        raise NotImplementedError
    assert "not written yet" in ch8.check_count_params(count_params).message


def test_derivations():
    V, T, L, C = d8.V, d8.T, d8.L, d8.C  # L is n_layer
    assert sp.simplify(d8.param_count() - (V * C + T * C + 2 * C + L * (12 * C**2 + 13 * C))) == 0
    n = sp.symbols("n", positive=True, integer=True)
    cost = d8.generation_cost()
    assert sp.simplify(cost["ratio"] - (n + 1) / 2) == 0
    assert sp.simplify(cost["pairs_without"] - n * (n + 1) * (n + 2) / 6) == 0
    assert sp.simplify(cost["pairs_with_cache"] - n * (n + 1) / 2) == 0  # attention over the cache: still n²
    half = d8.half_window_cost()
    assert sp.simplify(half["ratio"] - (3 * T + 2) / 8) == 0 and sp.simplify(half["with_cache"] - T) == 0
    assert d8.check() == {"formula vs ours": 0.0, "ours vs reference": 0.0, "cache ratio vs direct sum": 0.0,
                          "attention pairs vs direct sum": 0.0, "half-window cycle vs direct sum": 0.0}


def test_entropy_reference_has_no_negative_zero():
    """One-hot rows have entropy +0, not -0 (the checker used to print 'expected -0')."""
    h = ch8._entropy_reference(torch.eye(3, dtype=torch.float64))
    assert not torch.signbit(h).any()


def test_logit_lens_reference_is_what_the_inspector_reads():
    """The checker's LN_f(x) Eᵀ, on the residual stream lens.read records, is lens.read's own logit lens, and at the
    last layer the model's logits."""
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=5, block_size=8, n_layer=2, n_head=2, d_model=8)).double()
    with torch.no_grad():  # a LayerNorm that is not the identity: γ ≠ 1, β ≠ 0
        model.ln_f.weight.uniform_(0.5, 1.5)
        model.ln_f.bias.uniform_(-0.3, 0.3)
    reading = lens.read(model, CharTokenizer("abcde"), "abcaed")
    got = ch8._lens_reference(reading.residual, model.ln_f.weight.detach(), model.ln_f.bias.detach(),
                              model.tok_emb.weight.detach())
    torch.testing.assert_close(got, reading.lens_logits.to(got.dtype), atol=1e-6, rtol=1e-6)
    torch.testing.assert_close(got[-1], reading.logits.to(got.dtype), atol=1e-6, rtol=1e-6)


def test_ladder_gains_first_case_is_the_shipped_table():
    """The public case is ladder.json itself, so the answer is the table's per-component gain."""
    gains = ch8._gains_reference(ladder.load_table()["rungs"])
    assert set(gains) == {r.name for r in ladder.FULL.rungs if r.parent}


def test_same_function_leaves_the_global_generator_alone():
    """The checker builds its models under fork_rng: a notebook's own random draws are not shifted by checking."""
    torch.manual_seed(5)
    expected = torch.rand(3)
    torch.manual_seed(5)
    ch8.check_same_function(same_function)
    assert torch.equal(torch.rand(3), expected)


def test_checkpoint_checker_resumes_exactly_from_the_full_state():
    """The checker's loop is deterministic given its state: resuming from a copy of everything reproduces the
    uninterrupted run bit for bit, and a fresh run (nothing restored) does not."""
    case = ch8._loop_cases(ch8.generator(3))[0]
    assert torch.equal(ch8._loop_steps(case["cfg"], *ch8._loop_resume(case["cfg"], case["snapshot"]), 4)[-1][0],
                       case["expected"][-1][0])
    assert not torch.equal(ch8._loop_steps(case["cfg"], *ch8._loop_resume(case["cfg"], {}), 4)[-1][0],
                           case["expected"][-1][0])
