"""The book as a PDF (`make pdf`, tools/pdf.py): every page of the site in reading order, math typeset.

Needs the built site (`make book`) and Debian's Chromium. Uses `_build/pdf/transformer-math-lab.pdf` when it is
newer than every page of the site, else prints it once for this module.
"""

import re
from pathlib import Path

import pdf
import pytest
from conftest import ROOT

HTML = ROOT / "_build" / "html"
TEX = re.compile(r"\\(?:frac|begin|end|left|right|mathbf|mathrm|sqrt|sum|partial|operatorname|text)\b|\$\$|\\\(|\\\[")

pytestmark = [pytest.mark.site,
              pytest.mark.skipif(not (HTML / "index.html").is_file(), reason="run `make book` first"),
              pytest.mark.skipif(not pdf.CHROMIUM.exists(), reason="no Debian chromium (make chromium)")]


@pytest.fixture(scope="module")
def book_pdf() -> Path:
    newest_page = max(p.stat().st_mtime for p in HTML.glob("*/*.html"))  # a rebuild may leave index.html alone
    if not pdf.OUT.is_file() or pdf.OUT.stat().st_mtime < newest_page:
        pdf.print_pdf()
    return pdf.OUT


@pytest.fixture(scope="module")
def pages_text(book_pdf) -> list[str]:
    from pypdf import PdfReader

    return [page.extract_text() or "" for page in PdfReader(book_pdf).pages]


def _flat(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def _code_cells() -> str:
    """Every code cell's source, whitespace collapsed: TeX that a page's code holds as Python strings is code."""
    cells = [c for md in sorted(ROOT.glob("*/*.md")) if md.parts[-2] in ("book", "chapters")
             for c in re.findall(r"^```\{code-cell\}[^\n]*\n(.*?)^```$", md.read_text(encoding="utf8"), re.S | re.M)]
    return _flat("\n".join(cells))


def test_every_page_in_reading_order_with_its_title(pages_text):
    titles = [_flat(pdf.BeautifulSoup((HTML / p).read_text(encoding="utf8"), "html.parser").select_one("article h1")
                    .get_text(" ", strip=True).rstrip("#")).strip() for p in pdf.reading_order()]
    text, at, missing = _flat(" ".join(pages_text)), 0, []
    for title in titles:  # each title after the previous one
        found = text.find(title, at)
        if found < 0:
            missing.append(title)
        else:
            at = found + len(title)
    assert len(titles) >= 13 and not missing, f"page titles not in the PDF in reading order: {missing}"
    assert len(pages_text) >= 10 * len(titles), f"only {len(pages_text)} PDF pages for {len(titles)} site pages"


def test_no_raw_latex_outside_code(pages_text):
    code = _code_cells()
    raw = []
    for n, text in enumerate(pages_text, start=1):
        for line in text.splitlines():
            if TEX.search(line) and _flat(line).strip() not in code:
                raw.append(f"page {n}: {line.strip()[:80]}")
    assert not raw, f"raw LaTeX in the PDF: {raw[:5]}"


def test_internal_links_and_outline(book_pdf):
    from pypdf import PdfReader

    reader = PdfReader(book_pdf)
    internal = sum(1 for page in reader.pages for a in (page.get("/Annots") or [])
                   if a.get_object().get("/Subtype") == "/Link" and "/Dest" in a.get_object())
    assert internal >= 50, f"{internal} internal links: cross-references should point inside the PDF"
    assert len(reader.outline) >= 13, "the PDF outline (bookmarks) lists every page"
