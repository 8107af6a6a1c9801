"""The student edition of the website (issue 13): no solution text on any page, no instructor notebook.

``make test`` builds it (``tools/build.py --edition student`` into ``_build/student/_build/html``). Each chapter
page is loaded in Chromium and its visible text searched for the lines of every solution written in the chapter's
source; the full edition (``_build/html``) must show them, so the search is known to find what it looks for.
"""

import html
import json
import re

import pytest
from conftest import ROOT
from test_site import ARGS, CHROMIUM

STUDENT = ROOT / "_build" / "student" / "_build" / "html"
FULL = ROOT / "_build" / "html"
CHAPTERS = sorted((ROOT / "chapters").glob("0*.md"))
_GATED = re.compile(r"^```\{solution-start\}.*?^```\{solution-end\}\n```", re.S | re.M)
_CODE = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```$", re.S | re.M)

pytestmark = [pytest.mark.site,
              pytest.mark.skipif(not (STUDENT / "index.html").is_file(),
                                 reason="build the student edition first: tools/build.py --edition student"),
              pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (make chromium)")]


def solution_lines(page) -> list[str]:
    """Distinctive lines of the solutions' code: long enough to be unlikely elsewhere, not the stub's signature
    (which the student edition keeps) and not a check call."""
    lines = []
    for block in _GATED.findall(page.read_text(encoding="utf8")):
        for code in _CODE.findall(block):
            for line in code.splitlines():
                line = line.strip()
                if (len(line) >= 24 and not line.startswith(("#", ":", "def ", "from transformer_lab", "ch"))
                        and "check_" not in line):
                    lines.append(" ".join(line.split()))
    return lines


@pytest.fixture(scope="module")
def page_text():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        context = browser.new_context()
        context.route(re.compile(r"^https?://(?!127\.0\.0\.1)"), lambda route: route.abort())

        def text(html_file):
            """(the article's text outside solution boxes, the solution boxes' text, how many boxes), hidden
            (folded) text included, whitespace collapsed."""
            page = context.new_page()
            page.goto(html_file.as_uri())
            rest, inside, boxes = page.evaluate(
                "() => { const a = document.querySelector('article').cloneNode(true);"
                " const s = [...a.querySelectorAll('.solution')]; const inside = s.map(e => e.textContent).join(' ');"
                " s.forEach(e => e.remove()); return [a.textContent, inside, s.length]; }")
            page.close()
            return " ".join(rest.split()), " ".join(inside.split()), boxes

        yield text
        browser.close()


@pytest.mark.parametrize("page", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_student_page_shows_no_solution(page, page_text):
    """The lines that the full edition shows only inside a solution box appear nowhere on the student page."""
    if not (FULL / "chapters" / f"{page.stem}.html").is_file():
        pytest.skip("the full edition is needed to tell solution text from the rest: run `make book`")
    rest, inside, boxes = page_text(FULL / "chapters" / f"{page.stem}.html")
    lines = [line for line in solution_lines(page) if line in inside and line not in rest]
    assert boxes > 0 and len(lines) >= 3, f"{page.name}: only {len(lines)} solution-only lines to look for"
    text, _, student_boxes = page_text(STUDENT / "chapters" / f"{page.stem}.html")
    shown = [line for line in lines if line in text]
    assert not shown and student_boxes == 0, f"{page.name}: the student edition shows {shown[:3]}"


def solution_sentences(page) -> list[str]:
    """Sentences of the solutions' prose (the Markdown inside gated solutions), 40 characters or more, without
    markup: what a guard cell might quote."""
    out = []
    for block in _GATED.findall(page.read_text(encoding="utf8")):
        prose = _CODE.sub("", block)
        prose = re.sub(r"^```.*$|^:.*$|\$[^$]*\$|\{\w+\}`[^`]*`|[*_`]", " ", prose, flags=re.M)
        out += [s for s in (" ".join(x.split()) for x in re.split(r"(?<=[.:;!?])\s", prose)) if len(s) >= 40]
    return out


def _file_text(path) -> str:
    """A file's text as a reader or a program would find it: markup removed, entities decoded, a notebook's cell
    sources joined, whitespace collapsed."""
    raw = path.read_text(encoding="utf8", errors="replace")
    if path.suffix == ".ipynb":
        raw = "\n".join("".join(c["source"]) for c in json.loads(raw)["cells"])
    elif path.suffix in (".html", ".js", ".json", ".txt", ".xml"):
        raw = html.unescape(re.sub(r"<[^>]+>", "", raw))
    return " ".join(raw.replace("\\n", " ").split())


def _leaks(root, needles) -> dict[str, list[str]]:
    found = {}
    for path in sorted(p for p in root.rglob("*") if p.is_file() and p.suffix not in (".png", ".svg", ".woff2",
                                                                                        ".woff", ".ttf", ".ico")):
        text = _file_text(path)
        if hits := [n for n in needles if n in text]:
            found[path.relative_to(root).as_posix()] = hits
    return found


def test_no_file_of_the_student_edition_holds_a_solution(page_text):
    """Every file the student site ships (pages, search index, notebooks, scripts; no sources) is free of the
    solutions' code lines and prose sentences: those the full edition shows only inside a solution box."""
    if not (FULL / "index.html").is_file():
        pytest.skip("the full edition is needed to tell solution text from the rest: run `make book`")
    needles = set()
    for page in CHAPTERS:
        rest, inside, _ = page_text(FULL / "chapters" / f"{page.stem}.html")
        needles |= {n for n in (*solution_lines(page), *solution_sentences(page)) if n in inside and n not in rest}
    assert len(needles) > 150, f"only {len(needles)} solution lines and sentences to look for"
    assert not (STUDENT / "_sources").exists(), "the student edition copies the pages' sources"
    leaks = _leaks(STUDENT, sorted(needles))
    assert not leaks, "the student edition ships solutions: " + "; ".join(
        f"{path}: {hits[:2]}" for path, hits in list(leaks.items())[:6])


def test_student_edition_ships_no_instructor_notebook():
    notebooks = sorted(p.name for p in (STUDENT / "notebooks").glob("*.ipynb"))
    assert notebooks and all(name.endswith("-student.ipynb") for name in notebooks), notebooks
    for page in (STUDENT / "chapters").glob("0*.html"):
        assert "instructor.ipynb" not in page.read_text(encoding="utf8"), page.name


def test_the_midterm_solutions_are_in_the_full_edition_only():
    marker = "Midterm problem set, with worked solutions"
    assert marker not in (STUDENT / "book" / "course-guide.html").read_text(encoding="utf8")
    if (FULL / "book" / "course-guide.html").is_file():
        assert marker in (FULL / "book" / "course-guide.html").read_text(encoding="utf8")
