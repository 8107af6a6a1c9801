"""The book's prose is written for its reader (design/WRITING.md), measured by tools/prose.py.

Per chapter, main text without the exercises: 2,500-4,500 words, mean sentence at most 22 words, at most 5% of
sentences over 40 words, at most one parenthesis per 100 words. The front and back matter keep the same sentence
limits (not the length range). No page speaks of its own making.
"""

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tools"))

import prose  # noqa: E402

CHAPTERS = prose.CHAPTERS
MATTER = [ROOT / "book" / name for name in ("intro.md", "seed-claims.md", "course-guide.md", "fast.md")]


def test_eight_chapters_found():
    assert [p.name[:2] for p in CHAPTERS] == ["01", "02", "03", "04", "05", "06", "07", "08"]


@pytest.mark.parametrize("page", CHAPTERS + MATTER, ids=lambda p: p.name)
def test_prose_limits(page):
    s = prose.stats(page)
    print(f"{page.name}: {s.words} words, {s.sentences} sentences, mean {s.mean_sentence:.1f}, "
          f"{100 * s.long_share:.1f}% over 40, {s.parens_per_100:.2f} parentheses per 100 words, longest {s.longest}")
    failures = s.failures(word_range=page in CHAPTERS)
    assert not failures, f"{page.name}: " + "; ".join(failures)


def test_each_chapter_has_notes():
    for page in CHAPTERS:
        headings = [line for line in page.read_text(encoding="utf-8").splitlines() if line.startswith("## ")]
        assert "## Notes" in headings, f"{page.name} has no '## Notes' section"


# The measurement itself: catalogue of inputs and what the tool must make of them.
def test_sentence_statistics_on_a_known_text(tmp_path):
    page = tmp_path / "p.md"
    long = " ".join(["word"] * 45) + "."
    page.write_text(
        "# Title\n\nOne two three four. Five six $x^2 + y$ seven (eight).\n\n"
        "$$\na = b\n$$\n\n| a | table |\n|---|---|\n\n> a quoted seed line that is not ours.\n\n"
        "```{code-cell} ipython3\nprint('code is not prose')\n```\n\n"
        f"- A list item is a sentence.\n\n## Exercises\n\n{long}\n\n## Summary\n\nThe end e.g. here is one.\n",
        encoding="utf-8")
    s = prose.stats(page)
    # "One two three four." 4; "Five six X seven (eight)." 5; list item 6; "The end e.g. here is one." 6
    assert s.sentences == 4, s
    assert s.words == 21, s
    assert s.long_share == 0 and s.longest == 6
    assert s.parens_per_100 == pytest.approx(100 / 21)


def test_long_sentences_and_making_phrases_are_caught(tmp_path):
    page = tmp_path / "p.md"
    page.write_text(" ".join(["word"] * 41) + ". The README says so, as the issue asked.\n", encoding="utf-8")
    s = prose.stats(page)
    assert s.longest == 41 and s.long_share == 0.5
    assert sorted(h.lower() for h in s.making) == ["issue", "readme"]
    assert any("over 40" in f for f in s.failures(word_range=False))
    assert any("making" in f for f in s.failures(word_range=False))


def test_hidden_cells_may_speak_of_checks(tmp_path):
    page = tmp_path / "p.md"
    page.write_text("Text.\n\n```{code-cell} ipython3\n:tags: [remove-cell]\n\nclaim(x, 'guard')\n```\n",
                    encoding="utf-8")
    assert prose.stats(page).making == []
