"""The build-up ladder (chapter 8): each rung adds exactly its component, trains, and the table is reproducible."""

import json
import math

import pytest
import torch

from transformer_lab import cli, ladder
from transformer_lab.data import Corpus, shakespeare
from transformer_lab.gpt import GPT

V = 40
SMALL = ladder.LadderConfig(d_model=16, n_layer=2, n_head=2, block_size=16, batch_size=4, max_iters=3,
                            eval_windows=4)
RUNGS = {r.name: r for r in SMALL.rungs}


def names(model):
    return {n for n, _ in model.named_parameters()}  # the tied head is the embedding: named once


def block_params(parts):
    return {f"blocks.{l}.{p}.{w}" for l in range(SMALL.n_layer) for p in parts for w in ("weight", "bias")}


@pytest.fixture(scope="module")
def models():
    return {name: ladder.build_rung(r, V, SMALL) for name, r in RUNGS.items()}


def test_the_rungs_and_their_order():
    assert list(RUNGS) == ["bigram", "attention", "multi-head", "mlp", "residual", "layernorm", "learned",
                           "sinusoidal", "rope"]
    for r in SMALL.rungs[1:]:
        assert r.parent in RUNGS


@pytest.mark.parametrize(("name", "added"), [
    ("attention", block_params(["attn.in_proj", "attn.out_proj"])),
    ("multi-head", set()), ("mlp", block_params(["mlp.fc", "mlp.proj"])), ("residual", set()),
    ("layernorm", block_params(["ln1", "ln2"]) | {"ln_f.weight", "ln_f.bias"}),
    ("learned", {"pos_emb.weight"}), ("sinusoidal", set()), ("rope", set())])
def test_each_rung_adds_exactly_its_parameters(models, name, added):
    parent = RUNGS[name].parent
    assert names(models[parent]) <= names(models[name])
    assert names(models[name]) - names(models[parent]) == added


def test_the_bigram_is_an_embedding_and_the_tied_head(models):
    m = models["bigram"]
    assert names(m) == {"tok_emb.weight"} and m.head.weight is m.tok_emb.weight
    idx = torch.randint(V, (2, 5))
    torch.testing.assert_close(m(idx), m.tok_emb.weight[idx] @ m.tok_emb.weight.T)  # z = E[w] Eᵀ


def test_heads_and_flags_change_one_at_a_time(models):
    flags = ("n_head", "mlp", "residual", "layernorm", "positions")
    for r in SMALL.rungs[1:]:
        p = RUNGS[r.parent]
        changed = [f for f in flags if getattr(r, f) != getattr(p, f)]
        assert len(changed) == 1 or (r.parent == "bigram" and changed == ["n_head"]), (r.name, changed)
    assert [b.attn.n_head for b in models["attention"].blocks] == [1, 1]
    assert [b.attn.n_head for b in models["multi-head"].blocks] == [2, 2]


def test_the_residual_rung_adds_the_identity_path(models):
    """With every sub-layer's output projection zeroed, x + F(x) keeps the embedding and F(x) loses it."""
    idx = torch.randint(V, (2, 6))
    out = {}
    for name in ("mlp", "residual"):
        m = ladder.build_rung(RUNGS[name], V, SMALL)
        with torch.no_grad():
            for b in m.blocks:
                for lin in (b.attn.out_proj, b.mlp.proj):
                    lin.weight.zero_()
                    lin.bias.zero_()
            out[name] = m(idx)
        E = m.tok_emb.weight
    torch.testing.assert_close(out["residual"], E[idx] @ E.T)
    assert out["mlp"].abs().max() == 0


def test_the_position_rungs_are_the_books_gpt(models):
    """Each position rung is a GPT; the layernorm rung is that GPT without positions (same weights, same logits)."""
    for p in ("learned", "sinusoidal", "rope"):
        assert isinstance(models[p], GPT) and models[p].config.positions == p
    gpt = models["learned"]
    state = models["layernorm"].state_dict()
    gpt.load_state_dict({**state, "pos_emb.weight": torch.zeros_like(gpt.pos_emb.weight)})
    idx = torch.randint(V, (3, SMALL.block_size))
    with torch.no_grad():
        torch.testing.assert_close(gpt(idx), models["layernorm"](idx), rtol=0, atol=0)


def test_one_position_free_block_does_not_see_order():
    """Without positions, one block's prediction at the last position depends on the set of earlier tokens only."""
    one = ladder.LadderConfig(d_model=16, n_layer=1, n_head=2, block_size=16)
    idx, swapped = torch.tensor([[3, 7, 11, 5]]), torch.tensor([[7, 3, 11, 5]])
    with torch.no_grad():
        for rung in one.rungs[1:]:
            m = ladder.build_rung(rung, V, one)
            same = torch.allclose(m(idx)[0, -1], m(swapped)[0, -1], atol=1e-6)
            assert same == (rung.positions is None), rung.name


@pytest.fixture(scope="module")
def small_corpus():
    return Corpus.from_text(shakespeare()[:20_000], name="small")


def test_every_rung_trains_with_a_tiny_budget_and_reproducibly(small_corpus):
    table = ladder.run_ladder(small_corpus, SMALL)
    assert [r["name"] for r in table["rungs"]] == list(RUNGS)
    for r in table["rungs"]:
        assert math.isfinite(r["val_loss"]) and 0 < r["val_loss"] < 2 * math.log(V)
        assert r["params"] > 0 and r["cpu_seconds"] >= 0
    assert set(table["baselines"]) == {"1", "2", "3"}
    again = ladder.train_rung(RUNGS["rope"], small_corpus, SMALL)
    assert again["val_loss"] == table["rungs"][-1]["val_loss"]  # seeded: the same number


def test_the_table_round_trips(tmp_path, small_corpus):
    table = {"config": {}, "rungs": [], "baselines": {"1": 3.0}}
    path = ladder.save_table(table, tmp_path / "t.json")
    assert ladder.load_table(path) == table and not list(tmp_path.glob(".*tmp"))


def test_the_shipped_table_is_the_full_budget():
    table = ladder.load_table()
    assert table["config"] == ladder.asdict(ladder.FULL) and table["threads"] == 1
    assert [r["name"] for r in table["rungs"]] == [r.name for r in ladder.FULL.rungs]
    assert all(math.isfinite(r["val_loss"]) for r in table["rungs"])
    assert all(len(r["curve"]) == ladder.FULL.max_iters // ladder.CURVE_EVERY for r in table["rungs"])


def test_cli_ladder_writes_the_table(tmp_path, capsys):
    out = tmp_path / "ladder.json"
    assert cli.main(["ladder", "--max-iters", "2", "--out", str(out), "--quiet"]) == 0
    text = capsys.readouterr().out
    assert "layernorm" in text and "2-gram Kneser-Ney baseline" in text and str(out) in text
    table = json.loads(out.read_text())
    assert table["config"]["max_iters"] == 2 and len(table["rungs"]) == 9


@pytest.mark.parametrize(("argv", "words"), [
    (["--max-iters", "0"], "--max-iters must be a positive integer"),
    (["--threads", "0"], "--threads must be a positive integer"),
    (["--max-iters", "x"], "invalid int value"),
])
def test_cli_ladder_bad_input(argv, words, capsys):
    assert cli.main(["ladder", *argv]) == 2
    err = capsys.readouterr().err
    assert err.startswith("error:") and words in err and "Traceback" not in err


def test_cli_ladder_replaces_a_table_only_with_force(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(ladder, "run_ladder", lambda *a, **k: pytest.fail("trained before refusing"))
    assert cli.main(["ladder", "--max-iters", "1"]) == 2  # the default --out: the table shipped in the package
    assert "pass --force" in capsys.readouterr().err
    (tmp_path / "t.json").write_text("{}")
    assert cli.main(["ladder", "--max-iters", "1", "--out", str(tmp_path / "t.json")]) == 2
    assert (tmp_path / "t.json").read_text() == "{}"


def test_cli_ladder_out_is_a_directory(tmp_path, capsys):
    (tmp_path / "d.json").mkdir()
    assert cli.main(["ladder", "--out", str(tmp_path / "d.json"), "--max-iters", "1"]) == 2
    assert "is a directory" in capsys.readouterr().err
