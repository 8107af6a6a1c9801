"""Prose statistics of the book's pages: words, sentence lengths, parentheses, phrases about the book's making.

    python tools/prose.py [PAGE.md ...]     # a table for the given pages (default: every chapter)
    python tools/prose.py --long PAGE.md    # also list the sentences over 40 words

The main text of a page is its Markdown outside code cells, without the Exercises section, equations,
tables, headings, block quotes (the seed's words) and code. Inline maths, code and roles count as one word each.
Sentences are split by pySBD, a rule-based sentence boundary detector.
"""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CHAPTERS = sorted((ROOT / "chapters").glob("0*.md"))

LONG_SENTENCE = 40  # words
LIMITS = {"min_words": 2500, "max_words": 4500, "mean_sentence": 22.0, "long_share": 0.05, "parens_per_100": 1.0}

# Phrases that speak of the book's own making, not of mathematics or the reader's machine.
MAKING = [
    r"\bissues?\b(?! of)", r"\bREADME\b", r"\brecorded runs?\b", r"\bguard(s|ed)?\b", r"\bthe tests? allows?\b",
    r"\bthis book's machine\b", r"\bearlier versions?\b", r"\bprevious versions?\b", r"\bthis session\b",
    r"\bhidden assertions?\b", r"\bthe build fails\b",
]

_FENCE = re.compile(r"^(`{3,}|:{3,})\s*(\{([\w-]+)\})?")
_SKIP_DIRECTIVES = {"code-cell", "math", "literalinclude", "code", "bibliography", "raw", "list-table"}


@dataclass
class Stats:
    words: int
    sentences: int
    mean_sentence: float
    long_share: float
    parens_per_100: float
    longest: int
    making: list[str]

    def failures(self, word_range: bool = True) -> list[str]:
        out = []
        if word_range and not LIMITS["min_words"] <= self.words <= LIMITS["max_words"]:
            out.append(f"{self.words} words, expected {LIMITS['min_words']}-{LIMITS['max_words']}")
        if self.mean_sentence > LIMITS["mean_sentence"]:
            out.append(f"mean sentence {self.mean_sentence:.1f} words, expected <= {LIMITS['mean_sentence']}")
        if self.long_share > LIMITS["long_share"]:
            out.append(f"{100 * self.long_share:.1f}% of sentences over {LONG_SENTENCE} words, expected <= 5%")
        if self.parens_per_100 > LIMITS["parens_per_100"]:
            out.append(f"{self.parens_per_100:.2f} parentheses per 100 words, expected <= 1")
        if self.making:
            out.append(f"phrases about the book's making: {self.making}")
        return out


def cells(text: str) -> list[tuple[str, list[str], str]]:
    """Split a MyST notebook into (kind, tags, source) cells: kind is 'markdown' or 'code'."""
    out, lines, i = [], text.split("\n"), 0
    if lines and lines[0] == "---":  # front matter
        i = lines.index("---", 1) + 1
    buf: list[str] = []
    while i < len(lines):
        line = lines[i]
        if line.startswith("```{code-cell}"):
            out.append(("markdown", [], "\n".join(buf)))
            buf, i, tags = [], i + 1, []
            while i < len(lines) and lines[i] != "```":
                m = re.match(r":?tags: \[(.*)\]", lines[i])  # an option, or a line of the YAML block
                if m:
                    tags = [t.strip() for t in m.group(1).split(",")]
                buf.append(lines[i])
                i += 1
            out.append(("code", tags, "\n".join(buf)))
            buf = []
        else:
            buf.append(line)
        i += 1
    out.append(("markdown", [], "\n".join(buf)))
    return [c for c in out if c[2].strip()]


def main_text(text: str, exercises: bool = False) -> str:
    """The Markdown of a page, without the Exercises section (unless exercises=True), cell by cell."""
    parts, in_exercises = [], False
    for kind, _tags, src in cells(text):
        if kind != "markdown":
            continue
        kept = []
        for line in src.split("\n"):
            if line.startswith("## "):
                in_exercises = line.strip() == "## Exercises"
            if exercises or not in_exercises:
                kept.append(line)
        parts.append("\n".join(kept))
    return "\n\n".join(parts)


def paragraphs(markdown: str) -> list[str]:
    """The prose paragraphs of Markdown (list items are paragraphs of their own)."""
    out, para, fence, skip = [], [], None, False
    in_math = False

    def flush():
        if para:
            out.append(" ".join(para))
            para.clear()

    for raw in markdown.split("\n"):
        line = raw.strip()
        if fence:  # inside a directive or code block
            if line.startswith(fence) and line.rstrip("`:") == "":
                fence = None
                flush()
                continue
            if skip or re.match(r"^:[\w-]+:", line):
                continue
        else:
            m = _FENCE.match(line)
            if m:
                flush()
                fence, skip = m.group(1), (m.group(3) or "code") in _SKIP_DIRECTIVES
                continue
        if line.startswith("$$"):
            flush()
            if not (len(line) > 2 and line.endswith("$$") and len(line) > 4):
                in_math = not in_math
            continue
        if in_math:
            continue
        if not line or line.startswith(("#", "|", ">", "+++", "<!--")) or re.match(r"^\([\w-]+\)=$", line):
            flush()
            continue
        if re.match(r"^([-*+]|\d+\.)\s", line):
            flush()
            line = re.sub(r"^([-*+]|\d+\.)\s+", "", line)
        para.append(line)
    flush()
    return [p for p in out if p.strip()]


def plain(paragraph: str) -> str:
    """A paragraph with inline maths, code, roles and links reduced to words."""
    # one lower-case word each (a capital letter before a full stop would read as an initial, "J. Smith")
    p = re.sub(r"\{[\w:-]+\}`[^`]*`", "ref", paragraph)  # roles: {ref}`...`, {doc}`...`, {cite:p}`...`
    p = re.sub(r"`[^`]*`", "code", p)
    p = re.sub(r"\$[^$]+\$", "expr", p)
    p = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", p)
    p = re.sub(r"[*_]{1,2}(\S[^*_]*?)[*_]{1,2}", r"\1", p)
    return p


@lru_cache(maxsize=1)
def _segmenter():
    import pysbd

    return pysbd.Segmenter(language="en", clean=False)


def sentences(paragraph: str) -> list[str]:
    return [s.strip() for s in _segmenter().segment(plain(paragraph)) if re.search(r"\w", s)]


def word_count(sentence: str) -> int:
    return len(re.findall(r"[\w'’.,-]*\w", sentence))


def making_hits(text: str) -> list[str]:
    """Phrases about the book's making in the Markdown and the visible code cells of a page."""
    visible = []
    for kind, tags, src in cells(text):
        if kind == "markdown":
            visible.append(re.sub(r"\(([\w-]+)\)=", "", src))
        elif not {"remove-cell", "remove-input"} & set(tags):
            visible.append(src)
    joined = "\n".join(visible)
    return [m.group(0) for pattern in MAKING for m in re.finditer(pattern, joined, flags=re.IGNORECASE)]


def stats(path: Path, exercises: bool = False) -> Stats:
    text = path.read_text(encoding="utf-8")
    sents = [s for p in paragraphs(main_text(text, exercises)) for s in sentences(p)]
    lengths = [word_count(s) for s in sents]
    words = sum(lengths)
    parens = sum(plain(p).count("(") for p in paragraphs(main_text(text, exercises)))
    return Stats(words=words, sentences=len(sents), mean_sentence=words / max(1, len(sents)),
                 long_share=sum(n > LONG_SENTENCE for n in lengths) / max(1, len(sents)),
                 parens_per_100=100 * parens / max(1, words), longest=max(lengths, default=0),
                 making=making_hits(text))


def long_sentences(path: Path) -> list[tuple[int, str]]:
    text = path.read_text(encoding="utf-8")
    sents = [s for p in paragraphs(main_text(text)) for s in sentences(p)]
    return [(word_count(s), s) for s in sents if word_count(s) > LONG_SENTENCE]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("pages", nargs="*", type=Path)
    ap.add_argument("--long", action="store_true", help="list the sentences over 40 words")
    args = ap.parse_args(argv)
    pages = args.pages or CHAPTERS
    print(f"{'page':32} {'words':>6} {'sent':>5} {'mean':>5} {'>40':>6} {'(/100':>6} {'max':>4} making")
    for page in pages:
        s = stats(page)
        print(f"{page.name:32} {s.words:6d} {s.sentences:5d} {s.mean_sentence:5.1f} {100 * s.long_share:5.1f}%"
              f" {s.parens_per_100:6.2f} {s.longest:4d} {len(s.making)}")
        if args.long:
            for n, sent in long_sentences(page):
                print(f"    [{n}] {sent}")
            for hit in s.making:
                print(f"    making: {hit}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
