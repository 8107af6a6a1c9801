"""The built website in headless Chromium (Debian's, driven by Playwright), every off-host request blocked.

Needs `make book` first (`make test` does it). For each page: it loads with no console error, MathJax has
typeset every equation, every image and interactive figure renders, and moving a figure's slider changes its
frame. Requests to any host but the local server are blocked and counted: the count must be 0.
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
def page(browser, server):
    context = browser.new_context(viewport={"width": 1200, "height": 900})
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
    pg.on("requestfailed", lambda r: urlparse(r.url).netloc == host and pg.console_errors.append(f"failed {r.url}"))
    yield pg
    context.close()


def test_pages_were_built():
    assert "book/intro.html" in PAGES
    assert len(PAGES) >= 4


@pytest.mark.parametrize("path", PAGES)
def test_page_loads_typesets_and_renders(page, server, path):
    page.goto(f"{server}/{path}", wait_until="load")
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
    assert not page.console_errors, f"console errors on {path}: {page.console_errors}"


@pytest.mark.parametrize("path", PAGES)
def test_static_sliders_change_the_frame(page, server, path):
    page.goto(f"{server}/{path}", wait_until="load")
    figures = page.locator(".tl-fig").all()
    if not figures:
        pytest.skip(f"{path} has no interactive figure")
    for fig in figures:
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
            assert after_src != before_src, f"moving a slider on {path} did not change the frame"
            assert after_label != before_label
    assert not page.console_errors


def test_no_request_left_the_local_server():
    """Runs last in this module: every page above was loaded with off-host requests blocked and counted."""
    print(f"off-host requests: {len(OFF_HOST)}")
    assert OFF_HOST == [], f"{len(OFF_HOST)} off-host requests, e.g. {OFF_HOST[:5]}"


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
