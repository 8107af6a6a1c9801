"""The capstone's corpus, tokenizer and batches (chapter 8)."""

import pytest
import torch

from transformer_lab import data


def test_corpus_size_vocabulary_and_hash_are_the_recorded_ones():
    text = data.shakespeare()
    assert len(text) == data.CORPUS_CHARS
    assert len(set(text)) == data.CORPUS_VOCAB
    assert data.sha256(text) == data.CORPUS_SHA256
    assert 1_000_000 < len(text) < 1_200_000  # "about 1.1 M characters"


def test_corpus_is_tiny_shakespeare_style():
    text = data.shakespeare()
    assert text.startswith("First Citizen:\nBefore we proceed any further, hear me speak.\n\n")
    for markup in ("**", "_", "#", "[", "\\"):
        assert markup not in text, markup
    speeches = text.split("\n\n")
    assert all(s.split("\n", 1)[0].endswith(":") for s in speeches if s.strip())


def test_play_to_text_drops_directions_and_headings():
    md = ("# A Play\n\n## ACT I\n\n### SCENE I. A street.\n\n_Enter ROMEO and\nBENVOLIO_\n\n**ROMEO**  \n"
          "Good morrow, cousin.  \nIs the day so young?\n\n_\\[Aside]_  \n**BENVOLIO**  \nBut new _[struck]_ nine.\n\n"
          "*Exeunt.*\n")
    expected = "ROMEO:\nGood morrow, cousin.\nIs the day so young?\n\nBENVOLIO:\nBut new struck nine.\n"
    assert data.play_to_text(md) == expected


def test_split_is_90_10_in_order():
    corpus = data.load_corpus()
    n = len(corpus.text)
    assert len(corpus.train) == int(0.9 * n) and len(corpus.train) + len(corpus.val) == n
    assert corpus.tokenizer.decode(corpus.val[:50]) == corpus.text[int(0.9 * n):int(0.9 * n) + 50]


def test_tokenizer_round_trip_and_unknown_character_error():
    tok = data.CharTokenizer.from_text("hello world")
    ids = tok.encode("low")
    assert ids.dtype == torch.long and tok.decode(ids) == "low"
    with pytest.raises(ValueError, match=r"'é' \(U\+00E9\), first at position 1"):
        tok.encode("hé")
    with pytest.raises(ValueError, match="outside the vocabulary"):
        tok.decode([0, 99])
    with pytest.raises(ValueError, match="sorted and unique"):
        data.CharTokenizer("ba")


def test_get_batch_targets_are_inputs_shifted():
    ids = torch.arange(100)
    x, y = data.get_batch(ids, block_size=8, batch_size=4, generator=torch.Generator().manual_seed(0))
    assert x.shape == y.shape == (4, 8)
    torch.testing.assert_close(y, x + 1)
    with pytest.raises(ValueError, match="too short"):
        data.get_batch(ids[:5], block_size=8, batch_size=1)


def test_get_batch_draws_starts_as_documented():
    # starts lie in 0 .. len - T - 2 (the docstring says so): the last full window is never drawn; kept on purpose,
    # since changing the draw would change every training curve
    ids = torch.arange(12)
    x, _ = data.get_batch(ids, block_size=8, batch_size=2000, generator=torch.Generator().manual_seed(0))
    assert set(x[:, 0].tolist()) == {0, 1, 2}


def test_read_text_errors(tmp_path):
    with pytest.raises(ValueError, match="no such file"):
        data.read_text(tmp_path / "missing.txt")
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(ValueError, match="is empty"):
        data.read_text(tmp_path / "empty.txt")
    (tmp_path / "bin.dat").write_bytes(b"\x89PNG\x00\x01\x02" * 500)
    with pytest.raises(ValueError, match="binary"):
        data.read_text(tmp_path / "bin.dat")
    (tmp_path / "latin1.txt").write_bytes("café ".encode("latin-1") * 500)
    with pytest.raises(ValueError, match="not UTF-8"):
        data.read_text(tmp_path / "latin1.txt")
    (tmp_path / "short.txt").write_text("To be or not to be.")
    with pytest.raises(ValueError, match="too short: 19 characters"):
        data.read_text(tmp_path / "short.txt")
    (tmp_path / "ok.txt").write_text("ab" * 600)
    corpus = data.load_corpus(tmp_path / "ok.txt")
    assert corpus.tokenizer.chars == "ab" and corpus.name == "ok.txt"
