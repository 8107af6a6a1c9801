"""The Chinese edition (_build/html/zh) in headless Chromium, off-host requests blocked (test_site.py's fixtures;
test_site.py also runs its page checks on every Chinese page: loads, math typeset, figures and sliders, no raw
markup). Here, what only a second language needs: each page has an English twin and the language switch leads from
one to the other both ways, the Chinese prose is drawn with a CJK font, search finds Chinese words, the sidebar and
the build's own lines are Chinese, and both editions show the same code outputs and figures (one execution).
"""

import html
import re

import i18n  # tools/i18n.py (tests/conftest.py puts tools/ on the path)
import pytest
from test_site import (  # noqa: F401  (fixtures)
    CJK_FONTS,
    HTML,
    OFF_HOST,
    PAGES,
    ZH,
    ZH_PAGES,
    browser,
    fonts_drawing,
    page,
    server,
    viewport,
)

pytestmark = [pytest.mark.site, pytest.mark.skipif(not (ZH / "index.html").is_file(), reason="run `make book` first")]


def test_every_english_page_has_a_chinese_twin():
    assert ZH_PAGES == PAGES
    for path in ZH_PAGES:
        assert '<html lang="zh-CN"' in (ZH / path).read_text(encoding="utf8"), path


def _shared(html: str) -> tuple[list[str], list[str]]:
    """What both languages must show alike: every code block (the cells' code and printed outputs) and every
    image (figures and their slider frames)."""
    return re.findall(r"<pre>.*?</pre>", html, re.S), re.findall(r'<img [^>]*src="([^"]+)"', html)


@pytest.mark.parametrize("path", [p for p in PAGES if p.startswith("chapters/")])
def test_both_editions_show_the_same_code_outputs_and_figures(path):
    (en_code, en_images), (zh_code, zh_images) = (_shared((root / path).read_text(encoding="utf8"))
                                                  for root in (HTML, ZH))
    assert en_code and zh_code == en_code, f"{path}: the Chinese page's code or printed outputs differ"
    assert en_images and zh_images == en_images, f"{path}: the Chinese page's figures differ"


def _quoted_blocks(page_html: str) -> list[list[str]]:
    """Each block quote's paragraphs and list items, as plain text without spaces."""
    return [[re.sub(r"\s+", "", html.unescape(re.sub(r"<[^>]+>", "", block)))
             for block in re.findall(r"<(?:p|li)>(.*?)</(?:p|li)>", quote, re.S)]
            for quote in re.findall(r"<blockquote[^>]*>(.*?)</blockquote>", page_html, re.S)]


@pytest.mark.parametrize("path", [p for p in PAGES if p.startswith("chapters/") or p == "book/intro.html"])
def test_the_seed_is_quoted_in_its_own_words_without_the_gloss(path):
    """A quotation of the seed shows the seed's Chinese as written, and the English gloss beside it on the English
    page is not translated back into a second, paraphrased Chinese version."""
    english, chinese = (_quoted_blocks((root / path).read_text(encoding="utf8")) for root in (HTML, ZH))
    originals = [kept for quote in english if (kept := [b for b in quote if i18n.CJK.search(b)])]
    assert originals, f"{path}: no quotation of the seed on the English page"
    assert chinese == originals, f"{path}: the Chinese page's quotations are not the seed's own words alone"


# English phrases (three or more words, two of them lowercase words) in what a Chinese page shows, outside code,
# math, figures, references, quotation marks (a line of the corpus, an example sentence) and text marked lang="en"
# (the corpus's words, names left in English on purpose).
ENGLISH_PHRASES = r"""() => {
  const skip = 'pre, code, .math, mjx-container, script, style, .tl-fig-frames, nav, .headerlink, .cell_input, '
             + '.citation, [lang|="en"]';
  const out = [], article = document.querySelector('article.bd-article');
  const walker = document.createTreeWalker(article, NodeFilter.SHOW_TEXT);
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    const el = n.parentElement;
    if (!el || el.closest(skip) || !el.getClientRects().length) continue;
    const text = n.textContent;
    for (const m of text.matchAll(/[A-Za-z][A-Za-z'’-]*(?:[ ,]+[A-Za-z][A-Za-z'’-]*){2,}/g)) {
      const quoted = /[“"‘「]\s*$/.test(text.slice(0, m.index))
                     && /^[\s,.!?]*[”"’」]/.test(text.slice(m.index + m[0].length));
      if (!quoted && m[0].split(/[ ,]+/).filter(w => /^[a-z]{2,}$/.test(w) && w !== 'et' && w !== 'al').length >= 2)
        out.push(m[0].slice(0, 60));
    }
  }
  return out;
}"""


@pytest.mark.parametrize("path", ZH_PAGES)
def test_a_chinese_page_shows_no_english_phrase(page, server, path):
    """Prose, table cells the code writes, notes and chrome are Chinese; what stays English is code, math,
    figures, the references and what is marked lang="en"."""
    page.goto(f"{server}/zh/{path}", wait_until="load")
    found = page.evaluate(ENGLISH_PHRASES)
    print(f"{path}: {len(found)} English phrase(s)")
    assert not found, f"zh/{path} shows {len(found)} English phrase(s): {found[:8]}"


def test_language_switch_leads_both_ways(page, server):
    page.goto(f"{server}/chapters/03-optimization.html", wait_until="load")
    assert page.evaluate("() => document.documentElement.lang") == "en"
    page.locator(".language-switch").filter(visible=True).first.click()
    page.wait_for_url("**/zh/chapters/03-optimization.html")
    assert page.evaluate("() => document.documentElement.lang") == "zh-CN"
    assert page.locator("article h1").first.text_content().strip() != "Optimization"
    page.locator(".language-switch").filter(visible=True).first.click()
    page.wait_for_url(re.compile(r".*/(?<!zh/)chapters/03-optimization\.html$"))
    assert page.evaluate("() => document.documentElement.lang") == "en"
    page.goto(f"{server}/zh/book/intro.html", wait_until="load")
    page.locator(".language-switch").filter(visible=True).first.click()
    page.wait_for_url(re.compile(r".*/(?<!zh/)book/intro\.html$"))
    assert not page.console_errors


def test_chinese_prose_is_drawn_with_a_cjk_font(page, server):
    page.goto(f"{server}/zh/chapters/05-information-theory.html", wait_until="load")
    fonts = fonts_drawing(page, "article section > p")
    assert any("CJK" in f or f in CJK_FONTS for f in fonts), f"Chinese prose drawn with {fonts}"


@pytest.mark.parametrize(("word", "chapter"), [("交叉熵", "05-information-theory"), ("困惑度", "05-information-theory"),
                                           ("残差连接", "07-numerical-analysis"), ("梯度", "03-optimization")])
def test_search_finds_chinese_words(page, server, word, chapter):
    page.goto(f"{server}/zh/search.html?q={word}", wait_until="load")
    results = page.locator("#search-results li a")
    results.first.wait_for(timeout=15000)
    hrefs = [a.get_attribute("href") for a in results.all()]
    assert any(chapter in h for h in hrefs), f"searching {word} found {hrefs[:8]}"
    assert not page.console_errors


def test_no_request_left_the_local_server():
    """Runs last in this module: the Chinese pages were loaded with off-host requests blocked and counted."""
    assert OFF_HOST == [], f"{len(OFF_HOST)} off-host requests, e.g. {OFF_HOST[:5]}"


def test_sidebar_captions_and_page_lines_are_chinese():
    """The table of contents' part captions (translated by book/intro's catalogue), and the lines the build adds to
    a chapter (its notebooks, its slides: the English deck, which the Chinese page links) are Chinese too."""
    import i18n
    import yaml
    from conftest import ROOT

    chinese = {m.id: m.string for m in i18n.catalogue("book/intro") if m.id and m.string}
    html = (ZH / "chapters" / "01-linear-algebra.html").read_text(encoding="utf8")
    for part in yaml.safe_load((ROOT / "_toc.yml").read_text())["parts"]:
        assert f'<span class="caption-text">{chinese[part["caption"]]}</span>' in html, part["caption"]
    slides = re.search(r'<p class="tl-slides"><a href="([^"]+)">本章幻灯片</a>', html)
    assert slides and (ZH / "chapters" / slides.group(1)).resolve() == HTML / "slides" / "01-linear-algebra.html"
    assert (HTML / "slides" / "01-linear-algebra.html").is_file()
    assert '<p class="tl-downloads">下载本章' in html


def _display_equations(html: str) -> int:
    """The display equations MathJax typesets on a page (``test_site.py`` checks that each one is typeset)."""
    return len(re.findall(r'<div class="[^"]*\bmath\b[^"]*">\s*\\\[', html))


@pytest.mark.parametrize("path", PAGES)
def test_every_display_equation_survives_translation(path):
    en, zh = ((root / path).read_text(encoding="utf8") for root in (HTML, ZH))
    assert not re.search(r"<p>\s*::\s*</p>", zh), f"{path}: a translated equation became the paragraph '::'"
    assert _display_equations(zh) == _display_equations(en), f"{path}: the editions show different equations"
    translated = [m.string for m in i18n.catalogue(path.removesuffix(".html")) if m.id and m.string
                  and i18n.is_math(m.id) and not m.fuzzy and m.string != m.id]
    missing = [t for t in translated if html.escape(t.strip(), quote=False) not in zh]
    assert not missing, f"{path}: equations whose Chinese labels are not on the page: {missing[:2]}"


@pytest.mark.parametrize("path", ZH_PAGES)
def test_the_sites_own_words_are_chinese(path):
    """The theme's search field, the toggle buttons' hints and the author line (tools/i18n.py's CHROME)."""
    zh = (ZH / path).read_text(encoding="utf8")
    english = [w for w in ("Search this book", "Click to show", "Click to hide", "Show code cell", "Hide code cell",
                           "The Transformer Math Lab team") if w in zh]
    assert not english, f"{path}: English on the Chinese page: {english}"
    assert i18n.CHROME["search"] in zh and i18n.CHROME["author"] in zh


@pytest.mark.parametrize("path", ["chapters/03-optimization.html", "chapters/06-combinatorics.html"])
def test_figure_and_exercise_notes_show_the_page_language(page, server, path):
    """One execution writes the notes in both languages (transformer_lab.page.bilingual); each page shows one."""
    for prefix, shown, hidden in (("", "en", "zh"), ("zh/", "zh", "en")):
        page.goto(f"{server}/{prefix}{path}", wait_until="load")
        for lang, displayed in ((shown, True), (hidden, False)):  # inside a folded box is still displayed
            shown_here = page.evaluate(f"""() => [...document.querySelectorAll(
                '.tl-fig-note .tl-bilingual[lang={lang}], .tl-check .tl-bilingual[lang={lang}]')]
                .map(e => getComputedStyle(e).display !== 'none')""")
            assert len(shown_here) >= 2 and all(d == displayed for d in shown_here), (prefix + path, lang)
