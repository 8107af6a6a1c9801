"""The built website in headless Chromium (Debian's, driven by Playwright), every off-host request blocked.

Needs `make book` first (`make test` does it). For each page: it loads with no console error, MathJax has
typeset every equation, every image and interactive figure renders, and moving a figure's slider changes its
frame. Requests to any host but the local server are blocked and counted: the count must be 0.

As a reader uses it: the menu and outline buttons work at phone (390 px) and desktop (1280 px) widths, every chapter
page with everything it loads weighs at most 3 MB, nothing in the article column is wider than the column (wide
math scrolls in its own box), Chinese text is drawn with a CJK font, exercises show a neutral note on the static
page, search snippets show no TeX source, bibliography labels match the citations, the prose shows no raw MyST
markup. The pages of the Chinese edition (_build/html/zh) get the same page checks; test_site_zh.py has the rest.
"""

import functools
import http.server
import re
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest
from conftest import ROOT

HTML = ROOT / "_build" / "html"
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--disable-dev-shm-usage"]
PAGES = sorted(p.relative_to(HTML).as_posix() for d in ("book", "chapters") for p in (HTML / d).glob("*.html"))
CHAPTERS = [p for p in PAGES if p.startswith("chapters/")]
ZH = HTML / "zh"  # the Chinese edition (tools/i18n.py): the checks of both editions' pages run on each
ZH_PAGES = sorted(p.relative_to(ZH).as_posix() for d in ("book", "chapters") for p in (ZH / d).glob("*.html"))
BOTH = PAGES + [f"zh/{p}" for p in ZH_PAGES]
PHONE, DESKTOP = {"width": 390, "height": 844}, {"width": 1280, "height": 900}
MAX_PAGE_BYTES = 3_000_000
CJK_FONTS = ["Noto Sans CJK SC", "PingFang SC", "Hiragino Sans GB", "Microsoft YaHei", "Source Han Sans SC",
             "WenQuanYi Micro Hei"]

pytestmark = [pytest.mark.site,
              pytest.mark.skipif(not (HTML / "index.html").is_file(), reason="run `make book` first"),
              pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (make chromium)")]


@pytest.fixture(scope="module")
def server():
    handler = functools.partial(_QuietHandler, directory=str(HTML))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def browser():
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
        yield b
        b.close()


OFF_HOST: list[str] = []


@pytest.fixture
def viewport():
    return {"width": 1200, "height": 900}


@pytest.fixture
def page(browser, server, viewport):
    context = browser.new_context(viewport=viewport)
    host = urlparse(server).netloc

    def route(r):
        if urlparse(r.request.url).netloc == host:
            r.continue_()
        else:
            OFF_HOST.append(r.request.url)
            r.abort()

    context.route("**/*", route)
    pg = context.new_page()
    pg.console_errors = []
    pg.on("console", lambda m: m.type == "error" and pg.console_errors.append(m.text))
    pg.on("pageerror", lambda e: pg.console_errors.append(str(e)))
    # A request cut off because the test clicked on to the next page (net::ERR_ABORTED, e.g. the favicon) is no
    # fault of the site; any other failure is.
    pg.on("requestfailed", lambda r: urlparse(r.url).netloc == host and r.failure != "net::ERR_ABORTED"
          and pg.console_errors.append(f"failed {r.url}: {r.failure}"))
    pg.loaded_bytes = {}
    pg.on("requestfinished", lambda r: urlparse(r.url).netloc == host
          and pg.loaded_bytes.__setitem__(r.url, r.sizes()["responseBodySize"]))
    yield pg
    context.close()


def test_pages_were_built():
    assert "book/intro.html" in PAGES
    assert len(PAGES) >= 4


def check_page_renders(page, url):
    """The page at ``url`` loads with no console error, MathJax typeset every equation without a TeX error, every
    image and interactive figure renders (one frame each), its controls change the frame, no live widget view is
    left, and on a phone nothing is wider than the screen and no figure is shrunk."""
    page.goto(url, wait_until="load")
    n_math = page.locator(".math").count()
    if n_math:
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=20000)
        page.evaluate("() => MathJax.startup.promise")
        untypeset = page.evaluate("() => [...document.querySelectorAll('.math')]"
                                  ".filter(e => !e.querySelector('mjx-container'))"
                                  ".map(e => e.textContent.slice(0, 60))")
        assert not untypeset, f"equations MathJax did not typeset: {untypeset[:3]}"
        assert page.locator("mjx-merror").count() == 0, "MathJax reported a TeX error"
    broken = page.evaluate("() => [...document.querySelectorAll('img')].filter(i => !i.hidden)"
                           ".filter(i => !(i.complete && i.naturalWidth > 0)).map(i => i.src.slice(0, 80))")
    assert not broken, f"images that did not render: {broken}"
    for fig in page.locator(".tl-fig").all():
        assert fig.locator(".tl-fig-frames img:not([hidden])").count() == 1, "a figure must show exactly one frame"
    assert page.locator("script[type='application/vnd.jupyter.widget-view+json']").count() == 0
    check_sliders_change_the_frame(page, url)
    page.set_viewport_size(PHONE)
    page.wait_for_timeout(300)  # site.js marks wide formulas 200 ms after a resize
    assert page.evaluate(TOO_WIDE_FOR_PHONE) == [], f"{url} is wider than a {PHONE['width']} px phone"
    assert page.evaluate(SHRUNK_FIGURES) == [], f"{url}: figures shrunk on a phone, their labels below 9 px"
    assert not page.console_errors, f"console errors on {url}: {page.console_errors}"


# Figures drawn by transformer_lab.viz.to_png have no text below MIN_TEXT_PX = 9 pixels of the image; shown at
# their natural size or larger, no label is below 9 px on the screen. Listed: the figures shown smaller.
SHRUNK_FIGURES = """() => [...document.querySelectorAll('.tl-fig-frames img:not([hidden]), .cell_output img')]
  .map(i => [i, i.getBoundingClientRect().width]).filter(([i, w]) => w && w < i.naturalWidth - 1)
  .map(([i, w]) => `${Math.round(w)} of ${i.naturalWidth} px: ${(i.alt || '').slice(0, 40)}`)"""


# On a phone the page itself never scrolls sideways: what is wider than the screen (an element reaching past it
# with no scrolling box around it) is listed with its width.
TOO_WIDE_FOR_PHONE = """() => {
  const W = document.documentElement.clientWidth, bad = [];
  if (document.documentElement.scrollWidth <= W + 1) return bad;
  for (const e of document.querySelectorAll('body *')) {
    const r = e.getBoundingClientRect();
    if (!r.width || r.right <= W + 1) continue;
    let scroller = false;
    for (let p = e.parentElement; p && !scroller; p = p.parentElement)
      scroller = ['auto', 'scroll', 'hidden'].includes(getComputedStyle(p).overflowX);
    const text = (e.textContent || '').trim().slice(0, 40);
    if (!scroller) bad.push(`${e.tagName.toLowerCase()} "${text}" to ${Math.round(r.right)} px`);
  }
  return bad.length ? bad.slice(0, 4) : [`the page is ${document.documentElement.scrollWidth} px wide`];
}"""


def check_sliders_change_the_frame(page, url):
    """Moving each slider of each interactive figure on the loaded page to its other end shows another frame and
    label; choosing another option of each menu shows another frame."""
    for fig in page.locator(".tl-fig").all():
        for slider in fig.locator(".tl-fig-controls input[type=range]").all():
            label = slider.locator("xpath=..").locator("output")
            before_src = fig.locator(".tl-fig-frames img:not([hidden])").get_attribute("src")
            before_label = label.text_content()
            at_end = slider.get_attribute("value") == slider.get_attribute("max")
            slider.focus()
            page.keyboard.press("Home" if at_end else "End")
            assert fig.locator(".tl-fig-frames img:not([hidden])").count() == 1
            after_src = fig.locator(".tl-fig-frames img:not([hidden])").get_attribute("src")
            after_label = label.text_content()
            assert after_src != before_src, f"moving a slider on {url} did not change the frame"
            assert after_label != before_label
        for menu in fig.locator(".tl-fig-controls select").all():  # a choice among names
            before_src = fig.locator(".tl-fig-frames img:not([hidden])").get_attribute("src")
            values = [o.get_attribute("value") for o in menu.locator("option").all()]
            # by position: a string, even as value=, also matches an option's label ("1" is the label of value 0)
            menu.select_option(index=next(i for i, v in enumerate(values) if v != menu.input_value()))
            assert fig.locator(".tl-fig-frames img:not([hidden])").count() == 1
            assert fig.locator(".tl-fig-frames img:not([hidden])").get_attribute("src") != before_src, \
                f"choosing another option on {url} did not change the frame"


@pytest.mark.parametrize("path", BOTH)
def test_page_loads_typesets_renders_and_its_controls_work(page, server, path):
    check_page_renders(page, f"{server}/{path}")


def _typeset(page):
    if page.locator(".math").count():
        page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise", timeout=20000)
        page.evaluate("() => MathJax.startup.promise")
    page.evaluate("() => document.fonts.ready.then(() => true)")


def _visible(page, selector):
    return page.locator(selector).filter(visible=True)


@pytest.mark.parametrize("viewport", [PHONE], indirect=False)
def test_phone_menu_opens_the_chapter_list_and_a_link_navigates(page, server, viewport):
    page.goto(f"{server}/chapters/01-linear-algebra.html", wait_until="load")
    box = page.locator("#pst-primary-sidebar").bounding_box()
    assert box is None or box["x"] + box["width"] <= 0, "at 390 px the sidebar starts hidden"
    _visible(page, ".primary-toggle").first.click()
    link = page.locator("#pst-primary-sidebar-modal a", has_text="Probability")
    link.wait_for(state="visible", timeout=5000)
    link.click()
    page.wait_for_url("**/chapters/02-probability.html")
    _visible(page, ".secondary-toggle").first.click()
    page.locator("#pst-secondary-sidebar-modal a.nav-link").first.wait_for(state="visible", timeout=5000)
    assert not page.console_errors


@pytest.mark.parametrize("viewport", [DESKTOP], indirect=False)
def test_desktop_menu_folds_and_unfolds_the_sidebar_and_one_search_field(page, server, viewport):
    page.goto(f"{server}/chapters/01-linear-algebra.html", wait_until="load")
    sidebar = page.locator("#pst-primary-sidebar")
    assert sidebar.is_visible()
    assert page.locator("#pst-secondary-sidebar a.nav-link").first.is_visible(), "the outline is shown at 1280 px"
    assert _visible(page, ".search-button-field").count() == 1, "one search field, in the sidebar"
    _visible(page, ".primary-toggle").first.click()
    assert not sidebar.is_visible()
    _visible(page, ".primary-toggle").first.click()
    assert sidebar.is_visible()
    assert not page.console_errors


# An element is too wide when a box that hides its overflow cuts it, or when it reaches past the article column
# without a box that scrolls around it (a scrolling box must fit the column itself).
TOO_WIDE = """() => {
  const art = document.querySelector('article.bd-article'), A = art.getBoundingClientRect(), bad = [];
  for (const e of art.querySelectorAll('mjx-math, pre, img, table, .tl-fig, p, dl, ul, ol')) {
    const r = e.getBoundingClientRect();
    if (!r.width || e.closest('.tl-folded, details:not([open]), .toggle-hidden, [hidden]')) continue;
    let clip = null, scroller = null;
    for (let p = e.parentElement; p && p !== art && !scroller; p = p.parentElement) {
      const ox = getComputedStyle(p).overflowX;
      if (ox === 'auto' || ox === 'scroll') scroller = p;
      else if (ox !== 'visible' && !clip) clip = p;
    }
    const outer = scroller ? scroller.getBoundingClientRect() : r;
    if ((clip && r.right > clip.getBoundingClientRect().right + 2) || outer.right > A.right + 2
        || outer.left < A.left - 2)
      bad.push(`${e.tagName.toLowerCase()} "${(e.textContent || e.alt || '').trim().slice(0, 50)}" ` +
               `${Math.round(r.width)} px wide, column ${Math.round(A.width)} px`);
  }
  return bad;
}"""


@pytest.mark.parametrize("viewport", [DESKTOP], ids=["1280px"])
@pytest.mark.parametrize("path", CHAPTERS)
def test_chapter_fits_its_column_and_weighs_at_most_3MB(page, server, path, viewport):
    page.goto(f"{server}/{path}", wait_until="load")
    _typeset(page)
    page.wait_for_load_state("networkidle")
    total = sum(page.loaded_bytes.values())
    biggest = sorted(page.loaded_bytes.items(), key=lambda kv: -kv[1])[:4]
    print(f"{path}: {total / 1e6:.2f} MB in {len(page.loaded_bytes)} files")
    assert total <= MAX_PAGE_BYTES, f"{path}: {total / 1e6:.2f} MB with what it loads; largest: {biggest}"
    assert not any("html-manager" in u or "fontawesome.js" in u for u in page.loaded_bytes)
    for size in (DESKTOP, PHONE):
        page.set_viewport_size(size)
        page.wait_for_timeout(400)  # site.js marks wide formulas 200 ms after a resize
        too_wide = page.evaluate(TOO_WIDE)
        assert not too_wide, f"{path} at {size['width']} px: wider than the column: {too_wide[:5]}"


OUTLINE = """() => {
  const links = [...document.querySelectorAll('#pst-page-toc-nav a.nav-link')], line = window.innerHeight / 3;
  let reading = null;
  for (const a of links) {
    const t = document.getElementById(decodeURIComponent(a.hash.slice(1)));
    if (t && t.getBoundingClientRect().top <= line) reading = a.textContent.trim();
  }
  return [reading, links.filter(a => a.classList.contains('active')).map(a => a.textContent.trim())];
}"""


@pytest.mark.parametrize("viewport", [DESKTOP], ids=["1280px"])
@pytest.mark.parametrize("path", ["chapters/04-calculus.html", "zh/chapters/08-mini-gpt.html"])
def test_the_outline_lights_the_section_being_read(page, server, path, viewport):
    """Scrolled anywhere, by jumps, the outline lights one entry: the section whose heading is the last above the
    top third of the window (none above the first heading)."""
    page.goto(f"{server}/{path}", wait_until="load")
    height = page.evaluate("() => document.documentElement.scrollHeight")
    wrong = []
    for k in range(1, 30):
        page.evaluate(f"() => window.scrollTo(0, {height * k // 30})")
        page.wait_for_timeout(300)
        reading, lit = page.evaluate(OUTLINE)
        if lit != ([reading] if reading else []):
            wrong.append(f"at {k}/30 of the page, reading {reading!r}, lit {lit}")
    assert not wrong, f"{path}: the outline lit the wrong entry {len(wrong)} times of 29: {wrong[:3]}"
    assert not page.console_errors


def test_wide_display_math_scrolls_in_its_own_box(page, server):
    page.goto(f"{server}/chapters/01-linear-algebra.html", wait_until="load")
    _typeset(page)
    wide = page.evaluate("() => [...document.querySelectorAll('article .math')].filter(m => "
                         "m.querySelector('mjx-math') && m.querySelector('mjx-math').getBoundingClientRect().width "
                         "> m.getBoundingClientRect().width + 2).length")
    assert wide, "chapter 1 has formulas wider than the column (O_11): the test needs one"
    assert page.locator("span.math.tl-scroll, div.math mjx-container").count() >= 1


def test_long_listings_are_folded_behind_a_button(page, server):
    """Chapter 8 prints GPT.forward, which runs to 30 lines."""
    page.goto(f"{server}/chapters/08-mini-gpt.html", wait_until="load")
    assert page.locator(".tl-folded").count() >= 1, "chapter 8 folds its listing of GPT.forward"
    button = page.locator(".tl-fold-button").first
    pre = button.locator("xpath=preceding-sibling::div[1]//pre")
    before = pre.bounding_box()["height"]
    button.click()
    assert pre.bounding_box()["height"] > 1.5 * before
    assert not page.console_errors


def fonts_drawing(page, selector: str) -> set[str]:
    """The platform fonts Chromium draws the first element matching ``selector`` with (DevTools' CSS domain)."""
    page.evaluate("() => document.fonts.ready.then(() => true)")
    cdp = page.context.new_cdp_session(page)
    cdp.send("DOM.enable")
    cdp.send("CSS.enable")
    root = cdp.send("DOM.getDocument")["root"]["nodeId"]
    node = cdp.send("DOM.querySelector", {"nodeId": root, "selector": selector})["nodeId"]
    return {f["familyName"] for f in cdp.send("CSS.getPlatformFontsForNode", {"nodeId": node})["fonts"]}


def test_chinese_text_is_drawn_with_a_cjk_font(page, server):
    page.goto(f"{server}/chapters/01-linear-algebra.html", wait_until="load")
    fonts = fonts_drawing(page, "article blockquote p")
    family = page.evaluate("() => getComputedStyle(document.querySelector('article blockquote p')).fontFamily")
    assert all(name in family for name in CJK_FONTS), family
    assert any("CJK" in f or f in CJK_FONTS for f in fonts), (
        f"the epigraph is drawn with {fonts}: install a CJK font (`make chromium` installs fonts-noto-cjk)")


def test_search_snippets_show_no_tex_source(page, server):
    page.goto(f"{server}/search.html?q=attention", wait_until="load")
    snippets = page.locator("#search-results p.context")
    snippets.first.wait_for(timeout=15000)
    page.wait_for_timeout(500)
    texts = snippets.all_text_contents()
    assert texts and not [t for t in texts if re.search(r"\\[a-zA-Z]+|\\\(|\$\$", t)], texts[:3]


def test_no_request_left_the_local_server():
    """Runs last in this module: every page above was loaded with off-host requests blocked and counted."""
    print(f"off-host requests: {len(OFF_HOST)}")
    assert OFF_HOST == [], f"{len(OFF_HOST)} off-host requests, e.g. {OFF_HOST[:5]}"


RAW_MARKUP = re.compile(r"\{(?:ref|doc|numref|eq|term|cite(?::\w+)?|math|download)\}`"  # a role
                        r"|\*\*\w|\w\*\*|```|(?<![\\\w])\$\S")  # bold stars, a fence, a dollar of math


def raw_markup(html: str) -> list[str]:
    """Bits of MyST source left in a page's prose (a role, bold stars, a fence, a dollar sign of math): what a
    paragraph whose markup broke shows. Code, math, outputs and scripts are left out first."""
    body = re.search(r'<article class="bd-article"[^>]*>(.*)</article>', html, re.S)
    text = re.sub(r"<(script|style|pre|code|math)\b.*?</\1>|<(span|div) class=\"math[^\"]*\">.*?</\2>", " ",
                  body.group(1) if body else html, flags=re.S)
    text = re.sub(r'<div class="cell_output docutils container">.*?</div>\s*</div>', " ", text, flags=re.S)
    text = re.sub(r"<[^>]+>", " ", text)
    return [text[max(0, m.start() - 40):m.end() + 40].strip() for m in RAW_MARKUP.finditer(text)]


@pytest.mark.parametrize("path", BOTH)
def test_prose_shows_no_raw_markup(path):
    assert not (left := raw_markup((HTML / path).read_text(encoding="utf8"))), f"{path}: {left[:3]}"


@pytest.mark.parametrize("page", PAGES)
def test_cell_outputs_render_their_markdown(page):
    """Tables and math that cells display come out as HTML tables and typeset math, not as raw Markdown text
    (MyST-NB renders text/markdown outputs as plain CommonMark unless told otherwise)."""
    text = (HTML / page).read_text(encoding="utf8")
    outputs = re.findall(r'<div class="cell_output docutils container">(.*?)</div>\s*</div>\s*</div>', text, re.S)
    for out in outputs:
        shown = re.sub(r"<script.*?</script>|<img[^>]*>|<pre>.*?</pre>", "", out, flags=re.S)
        assert "|---" not in shown, f"{page}: a Markdown table shown as text"
        assert not re.search(r"(?<!\\)\$[^$<\n]{1,200}\$", shown), f"{page}: $math$ shown as text"


def test_exercises_show_a_neutral_note_on_the_static_page():
    """On the website no exercise is answered: its check shows where to check an answer, not a red failure, and
    messages show code as code, not between backticks."""
    for path in CHAPTERS:
        text = (HTML / path).read_text(encoding="utf8")
        checks = re.findall(r'<div class="tl-check [^"]*">.*?</div>', text, re.S)
        assert "not written yet" not in text, path
        assert not [c for c in checks if "`" in c], f"{path}: a check message with literal backticks"
        assert "run this in Jupyter to check your answer" in text, f"{path}: no exercise note"


def test_favicon_and_bibliography_labels_as_cited():
    intro = (HTML / "book" / "intro.html").read_text(encoding="utf8")
    icon = re.search(r'<link rel="icon" href="([^"]+)"', intro)
    assert icon and (HTML / "book" / icon.group(1)).resolve().is_file()
    refs = (HTML / "book" / "references.html").read_text(encoding="utf8")
    labels = {i: re.sub(r"<[^>]+>", "", label) for i, label in re.findall(
        r'<div class="citation" id="([^"]+)"[^>]*>\s*<span class="label"><span class="fn-bracket">\[</span>(.*?)'
        r'<span class="fn-bracket">', refs)}
    odd = [label for label in labels.values() if not re.fullmatch(r"\D+, (\d{4}[a-z]?|n\.d\.)", label)]
    assert labels and not odd, f"bibliography labels not of the form 'Author et al., 2017': {odd[:5]}"
    # a parenthetical citation shows the whole label, a textual one ("Liu et al. [2020b]") the label's year
    cites = [(i, re.sub(r"<[^>]+>", "", text)) for path in CHAPTERS for i, text in re.findall(
        r'<a class="reference internal" href="../book/references.html#([^"]*)" title="[^"]*">(.*?)</a>',
        (HTML / path).read_text(encoding="utf8"))]
    wrong = [(labels.get(i), text) for i, text in cites
             if labels.get(i) is None or not (labels[i] == text or labels[i].endswith(", " + text))]
    assert cites and not wrong, f"citations that do not match their bibliography label: {wrong[:5]}"
