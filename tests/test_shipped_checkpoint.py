"""The checkpoint shipped in the package (chapter 8): it loads, it is small, it meets its stated val loss."""

import json

import pytest
import torch

from transformer_lab.cli import load_model, shipped_checkpoint
from transformer_lab.data import CORPUS_SHA256, load_corpus
from transformer_lab.train import evaluate_loss

STATED_VAL_LOSS = 1.98  # nats per character over the whole val split (measured 1.9787), as stated in the README


@pytest.fixture(scope="module")
def shipped():
    return load_model()


def test_it_is_ours_small_and_trained_on_the_recorded_corpus(shipped):
    _, tok, record = shipped
    path = shipped_checkpoint()
    weights = path.parent / json.loads(path.read_text())["weights"]
    assert weights.stat().st_size < 10 * 2**20
    assert record["corpus_sha256"] == CORPUS_SHA256 and record["optimizer"] is None
    assert tok.vocab_size == 64


def test_it_meets_its_stated_val_loss(shipped):
    model, _, record = shipped
    torch.set_num_threads(1)
    val = evaluate_loss(model, load_corpus().val, block_size=model.config.block_size)
    assert val == pytest.approx(record["val_loss_full"], abs=1e-3)
    assert val <= STATED_VAL_LOSS


def test_it_writes_shakespeare_like_text(shipped):
    model, tok, _ = shipped
    out = tok.decode(model.generate(tok.encode("ROMEO:\n").view(1, -1), 200, temperature=0.8,
                                    generator=torch.Generator().manual_seed(0))[0])
    assert out.count("\n\n") >= 1 and ":\n" in out[8:]  # it ends speeches and starts new ones
