"""The chapter decks (tools/slides.py) in headless Chromium, offline, at 1280×720: each loads with no console
error, has enough slides for two 90-minute sessions with a "Session 2" marker, and every slide (with all its
fragments shown) fits the slide box, carries speaker notes and typesets its maths without a TeX error. Every
off-host request is blocked.

The decks are generated into a temporary folder (figures from ``_build/jupyter_execute`` when a build left it)
and served with the site's vendored reveal.js and MathJax (tools/fetch_assets.sh). Set ``TL_SCREENSHOTS=DIR``
to keep screenshots of a few slides of chapters 2, 4 and 5.
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
    decks = write_decks(root / "slides", executed=ROOT / "_build" / "jupyter_execute",
                        cache=ROOT / "_build" / ".jupyter_cache")
    handler = functools.partial(http.server.SimpleHTTPRequestHandler, directory=str(root))
    handler.log_message = lambda *a: None
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}", decks
    httpd.shutdown()


SLIDE_FACTS = """() => {
  const {width, height} = Reveal.getConfig();
  Reveal.configure({transition: "none", backgroundTransition: "none"});  // each slide measured where it rests
  return Reveal.getSlides().map((slide, i) => {
    Reveal.slide(i, 0, 99);  // the slide with every fragment shown: the slide-changed handler fits it
    const box = document.querySelector(".reveal .slides").getBoundingClientRect(), k = box.width / width;
    const out = [...slide.querySelectorAll("mjx-math, img, table, li, p, h2, h3, h4")].filter(e => {
      const r = e.getBoundingClientRect();
      return r.width && (r.left < box.left - 2 || r.right > box.left + width * k + 2 || r.top < box.top - 2
                         || r.bottom > box.top + height * k + 2);
    }).map(e => e.tagName + ": " + e.textContent.slice(0, 40));
    return {i, h: slide.scrollHeight, w: slide.scrollWidth, width, height, out,
            notes: (slide.querySelector("aside.notes") || {textContent: ""}).textContent.trim().length > 0,
            merror: slide.querySelectorAll("mjx-merror").length, math: slide.querySelectorAll("mjx-container").length,
            fragments: slide.querySelectorAll(".fragment").length,
            kind: slide.querySelector("img.fig") ? "figure" : "",
            title: (slide.querySelector("h2, h3, h4") || {textContent: ""}).textContent.slice(0, 60)};
  });
}"""


@pytest.mark.timeout(240)
def test_every_deck_fits_its_slides_has_notes_and_steps_offline(site):
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
            page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                                   timeout=20_000)
            page.evaluate("() => MathJax.startup.promise")
            facts = page.evaluate(SLIDE_FACTS)
            assert 35 <= len(facts) <= 80, f"{deck.name}: {len(facts)} slides"
            assert sum(f["title"] == "Session 2" for f in facts) == 1, deck.name
            assert sum(f["fragments"] for f in facts) >= 10, f"{deck.name}: too little is stepped"
            for f in facts:
                where = f"{deck.name}, slide {f['i']} ({f['title']!r})"
                assert f["h"] <= f["height"] + 1 and f["w"] <= f["width"] + 1, f"{where} overflows: {f}"
                assert not f["out"], f"{where}: drawn outside the slide: {f['out']}"
                assert f["notes"], f"{where} has no speaker notes"
                assert f["merror"] == 0, f"{where}: a TeX error"
            assert sum(f["math"] for f in facts) > 0, f"{deck.name}: no typeset math"
            page.evaluate("() => Reveal.slide(0)")  # the keys step through fragments, then slides
            for _ in range(sum(f["fragments"] for f in facts) + len(facts) - 1):
                page.keyboard.press("ArrowRight")
            assert page.evaluate("() => Reveal.isLastSlide()"), deck.name
            if os.environ.get("TL_SCREENSHOTS") and deck.name[:2] in ("02", "04", "05"):
                kinds = ("Derivation", "Worked example", "figure")
                shown = [next((f["i"] for f in facts if kind in f["title"] + f["kind"]), 0) for kind in kinds]
                for i in (0, 2, *shown, len(facts) // 2):
                    page.evaluate(f"() => Reveal.slide({i}, 0, 99)")
                    page.wait_for_timeout(800)  # the slide transition
                    page.screenshot(path=str(Path(os.environ["TL_SCREENSHOTS"]) / f"slide-{deck.name[:2]}-{i}.png"))
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
