"""The front and back matter keep their promises: every seed claim is linked, every exercise is in the course guide
and has a checker, every chapter opens with the seed in Chinese and English."""

import importlib
import re

import pytest
from conftest import ROOT

CHAPTERS = sorted((ROOT / "chapters").glob("0*.md"))


def labels(pattern: str) -> dict[str, str]:
    return {m.group(1): p.stem for p in CHAPTERS for m in re.finditer(pattern, p.read_text(), re.M)}


def test_every_seed_claim_links_to_where_the_book_treats_it():
    page = (ROOT / "book" / "seed-claims.md").read_text()
    claim_labels = labels(r"^\((claim-(?:\d+|C))\)=")
    for n in range(1, 36):
        row = re.search(rf"^\| {n} \|.*\|$", page, re.M)
        assert row, f"claim {n} is missing from the seed's claims page"
        targets = re.findall(r"\{ref\}`(?:[^`<]*<)?(claim-[\w-]+)>?`", row.group(0))
        assert targets, f"claim {n} has no link"
        for target in targets:
            assert target in claim_labels, f"claim {n}: no chapter has the target ({target})="
    assert "<claim-C>`" in page
    assert "claim-C" in claim_labels
    assert "in preparation" not in page


def test_every_seed_claim_row_has_its_four_cells():
    """A bare | inside a cell (the seed writes P(y|x)) ends the cell there and shifts the rest of the row."""
    page = (ROOT / "book" / "seed-claims.md").read_text()
    for row in re.findall(r"^\| \d+ \|.*$", page, re.M):
        cells = re.split(r"(?<!\\)\|", row.strip())[1:-1]
        assert len(cells) == 4, f"{len(cells)} cells, not 4 (escape a | inside a cell as \\|): {row[:80]}"


def test_seed_claim_links_show_no_raw_latex():
    """A {ref} without its own text shows the target's heading, and Sphinx prints a heading's $math$ as raw
    LaTeX in a link: such links must carry their own text."""
    page = (ROOT / "book" / "seed-claims.md").read_text()
    headings = {label: m.group(2) for p in CHAPTERS
                for m in re.finditer(r"^((?:\([\w-]+\)=\n)+)#+ (.*)$", p.read_text(), re.M)
                for label in re.findall(r"\((claim-[\w-]+)\)=", m.group(1))}  # labels stacked above a heading
    for target in re.findall(r"\{ref\}`(claim-[\w-]+)`", page):
        assert "$" not in headings.get(target, ""), f"the link to {target} would show {headings[target]!r}"


def test_every_exercise_has_a_checker_and_is_in_the_course_guide():
    guide = (ROOT / "book" / "course-guide.md").read_text()
    exercise_labels = labels(r"^:label: (ch\d-ex-[\w-]+)")
    assert len(exercise_labels) >= 3 * 7
    for label, chapter in exercise_labels.items():
        assert f"{{ref}}`{label}`" in guide, f"exercise {label} ({chapter}) is not in the course guide"
    for page in CHAPTERS:
        n = int(page.name[:2])
        registry = importlib.import_module(f"transformer_lab.exercises.ch{n}").EXERCISES
        text = page.read_text()
        stubs = re.findall(r":tags: \[exercise\]\s+def (\w+)\(", text)
        assert len(stubs) >= 3, f"{page.name} has {len(stubs)} exercise stubs"
        assert set(stubs) == set(registry), f"{page.name}: stubs {stubs} vs checkers {sorted(registry)}"
        assert text.count("{solution-start}") == len(stubs), f"{page.name}: every exercise needs a hidden solution"
        assert text.count(":class: dropdown") >= len(stubs)


@pytest.mark.parametrize("page", [p for p in CHAPTERS if not p.name.startswith("08")], ids=lambda p: p.stem)
def test_chapter_opens_with_the_seed_in_both_languages(page):
    head = page.read_text()[:6000]
    assert re.search(r"[\u4e00-\u9fff]{4,}", head), "no Chinese quotation of the seed near the top"
    assert "What the seed gets wrong" in page.read_text()


def test_notation_names_code_that_exists():
    """Every name in the notation page's code column occurs in the package (it once named nanoGPT's `wte`)."""
    words = set(re.findall(r"\w+", " ".join(p.read_text() for p in (ROOT / "transformer_lab").rglob("*.py"))))
    page = (ROOT / "book" / "notation.md").read_text()
    names = [part for row in re.findall(r"^\|[^|\n]*\|([^|\n]*)\|", page, re.M)
             for code in re.findall(r"`([^`]+)`", row) for part in re.findall(r"[A-Za-z_]\w*", code)]
    assert len(names) > 20
    assert not [n for n in names if n not in words]


MIN_CLAIMS = 12
"""The fewest guarded sentences a chapter may have (issue 11: every sentence about a figure or an experiment)."""


@pytest.mark.parametrize("page", CHAPTERS, ids=lambda p: p.stem)
def test_chapter_guards_its_sentences_in_hidden_cells(page):
    """Every chapter guards the sentences about its results with ``claim`` (``transformer_lab.page``), in cells
    that the website does not show; the build report counts them."""
    import build

    assert build.claim_counts()[page.stem] >= MIN_CLAIMS, f"{page.name} guards too few of its sentences"
    for cell in re.findall(r"^```\{code-cell\}[^\n]*\n(.*?)^```$", page.read_text(), re.S | re.M):
        if build.CLAIM_CALL.search(cell):
            hidden = re.search(r"^:?tags: \[[^\]]*remove-cell", cell, re.M)
            assert hidden, f"{page.name}: a guard shows on the page:\n{cell}"


@pytest.mark.parametrize("page", CHAPTERS, ids=lambda p: p.stem)
def test_the_code_the_site_hides_starts_collapsed_in_jupyterlab(page):
    """A chapter opened in JupyterLab shows the reader's cells: the set-up and the guards the website hides start
    with their source collapsed (``python tools/hide_build_cells.py PAGE`` marks them)."""
    import jupytext

    hidden_on_site = {"remove-cell", "remove-input", "hide-input"}
    shown = [c.source.splitlines()[0][:60] for c in jupytext.read(page).cells
             if c.cell_type == "code" and hidden_on_site & set(c.metadata.get("tags", []))
             and not c.metadata.get("jupyter", {}).get("source_hidden")]
    assert not shown, (f"{page.name}: {len(shown)} cell(s) the site hides show their source in JupyterLab, e.g. "
                       f"{shown[:3]} (python tools/hide_build_cells.py chapters/{page.name})")


CODE_WIDTH = 88
"""The longest line of a code cell the reader sees: ruff's default line length, so that a code block on the site
scrolls sideways only where a line cannot be broken."""


@pytest.mark.parametrize("page", [*CHAPTERS, ROOT / "book" / "fast.md"], ids=lambda p: p.stem)
def test_code_the_reader_sees_fits_88_columns(page):
    long = []
    for cell in re.findall(r"^```\{code-cell\}[^\n]*\n(.*?)^```$", page.read_text(), re.S | re.M):
        if re.search(r"^(:tags:|tags:) .*\b(remove-cell|remove-input)\b", cell, re.M):
            continue  # not on the page
        long += [line.strip()[:60] for line in cell.splitlines() if len(line) > CODE_WIDTH]
    assert not long, f"{page.name}: {len(long)} code lines over {CODE_WIDTH} characters: {long[:3]}"


@pytest.mark.parametrize("page", [*CHAPTERS, *sorted((ROOT / "book").glob("*.md"))], ids=lambda p: p.stem)
def test_no_glyph_needs_an_emoji_font(page):
    """A reader without an emoji font sees an empty box for 💡 (the seed's mind map marks its key lines so)."""
    assert not re.findall(r"[\U0001F000-\U0001FAFF]", page.read_text()), page.name
