"""The chapter decks (tools/slides.py) in headless Chromium, offline: each loads with no console error, MathJax
typesets its equations, and the arrow keys step through every slide. Every off-host request is blocked.

The decks are generated into a temporary folder (figures from ``_build/jupyter_execute`` when a build left it)
and served with the site's vendored reveal.js and MathJax (tools/fetch_assets.sh). Set ``TL_SCREENSHOTS=DIR``
to keep screenshots of chapter 2's first section slide and first exercise.
"""

import functools
import http.server
import os
import threading
from pathlib import Path
from urllib.parse import urlparse

import pytest
from conftest import ROOT
from slides import write_decks

VENDOR = ROOT / "_build" / "assets" / "vendor"
CHROMIUM = Path("/usr/bin/chromium")
pytestmark = [pytest.mark.skipif(not (VENDOR / "reveal.js" / "dist" / "reveal.js").is_file(),
                                 reason="run bash tools/fetch_assets.sh first"),
              pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (make chromium)")]


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("site")
    (root / "_static").mkdir()
    (root / "_static" / "vendor").symlink_to(VENDOR)
    decks = write_decks(root / "slides", executed=ROOT / "_build" / "jupyter_execute")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", decks
    httpd.shutdown()


@pytest.mark.timeout(180)
def test_every_deck_loads_offline_and_steps_through(site):
    from playwright.sync_api import sync_playwright

    base, decks = site
    host, off_host, errors = urlparse(base).netloc, [], []
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM),
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        context = browser.new_context(viewport={"width": 1280, "height": 720})
        context.route("**/*", lambda r: r.continue_() if urlparse(r.request.url).netloc == host
                      else (off_host.append(r.request.url), r.abort()))
        page = context.new_page()
        page.on("console", lambda m: m.type == "error" and errors.append(m.text))
        page.on("pageerror", lambda e: errors.append(str(e)))
        for deck in decks:
            page.goto(f"{base}/slides/{deck.name}", wait_until="load")
            page.wait_for_function("() => window.Reveal && Reveal.isReady()", timeout=20_000)
            n = page.evaluate("() => Reveal.getTotalSlides()")
            assert n >= 4, f"{deck.name}: {n} slides"
            page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                                   timeout=20_000)
            page.evaluate("() => MathJax.startup.promise")
            for i in range(1, n):
                page.keyboard.press("ArrowRight")
                page.wait_for_function(f"() => Reveal.getState().indexh === {i}", timeout=5_000)
                if os.environ.get("TL_SCREENSHOTS") and deck.name.startswith("02-") and i in (1, n - 6):
                    page.wait_for_timeout(800)  # the slide transition
                    page.screenshot(path=str(Path(os.environ["TL_SCREENSHOTS"]) / f"slide-02-{i}.png"))
            assert page.evaluate("() => Reveal.isLastSlide()"), deck.name
            page.keyboard.press("ArrowLeft")
            page.wait_for_function(f"() => Reveal.getState().indexh === {n - 2}", timeout=5_000)
            assert page.locator(".reveal mjx-container").count() > 0, f"{deck.name}: no typeset math"
            assert page.locator(".reveal mjx-merror").count() == 0, f"{deck.name}: a TeX error"
        browser.close()
    assert not errors, errors
    assert not off_host, off_host


SITE = ROOT / "_build" / "html"


@pytest.mark.skipif(not (SITE / "index.html").is_file(), reason="run `make book` first")
def test_the_built_site_has_a_deck_per_chapter_linked_from_its_page():
    """`make book` writes slides/NN-name.html (tools/slides_ext.py) and each chapter page links its deck."""
    for page in sorted((ROOT / "chapters").glob("0*.md")):
        deck = SITE / "slides" / f"{page.stem}.html"
        assert deck.is_file() and "Reveal.initialize" in deck.read_text(encoding="utf8"), deck
        assert f'href="../slides/{page.stem}.html"' in (SITE / "chapters" / f"{page.stem}.html").read_text(
            encoding="utf8"), page.stem
