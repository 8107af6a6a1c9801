"""Print the built website to one PDF: ``_build/pdf/transformer-math-lab.pdf`` (what `make pdf` runs).

    python tools/pdf.py          # needs _build/html (make book) and Debian's Chromium (make chromium)

Every page of the book, in reading order (the site's "next" links from the first page), goes into one HTML
document served beside the site's own pages, so that its stylesheets, MathJax and images load as they do on the
website: ids are prefixed with the page's name and links between pages become links inside the document, which
Chromium prints as working internal PDF links. Interactive figures print at their default frame (the other frames
are dropped, the controls hidden by the print rules of book/_static/book.css). The same Chromium the browser
tests use (Playwright driving /usr/bin/chromium) prints it once MathJax has typeset every formula; the PDF gets
an outline (bookmarks) from the headings. Nothing is requested from another host.
"""

from __future__ import annotations

import functools
import http.server
import re
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urljoin, urlparse

from bs4 import BeautifulSoup

ROOT = Path(__file__).resolve().parent.parent
HTML = ROOT / "_build" / "html"
OUT = ROOT / "_build" / "pdf" / "transformer-math-lab.pdf"
CHROMIUM = Path("/usr/bin/chromium")
ARGS = ["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
        "--disable-background-networking", "--disable-component-update", "--disable-sync"]
# Served at the depth of chapters/*.html, so that every relative link of the pages resolves unchanged.
COMBINED = "chapters/_transformer-math-lab-print.html"
PRINT_CSS = """
.tl-pdf-page + .tl-pdf-page { break-before: page; }
.tl-pdf-page h1 { display: block !important; }  /* the theme's print rules hide a page's title */
.bd-article-container, .bd-content, .bd-main, .bd-container__inner { max-width: none !important; }
"""
FOOTER = ('<div style="font-size: 8px; width: 100%; text-align: center; color: #666;">'
          '<span class="pageNumber"></span></div>')


def reading_order(html_dir: Path = HTML) -> list[str]:
    """The site's pages as a reader pages through them: the first page (where index.html sends the reader),
    then each page's ``<link rel="next">``."""
    first = re.search(r'url=([^"\'>\s]+)', (html_dir / "index.html").read_text(encoding="utf8"))
    pages, page = [], first.group(1) if first else "book/intro.html"
    while page and page not in pages and (html_dir / page).is_file():
        pages.append(page)
        link = BeautifulSoup((html_dir / page).read_text(encoding="utf8"), "html.parser").find("link", rel="next")
        page = urlparse(urljoin(page, link["href"])).path if link else None
    return pages


def anchor(page: str, fragment: str = "") -> str:
    """The id, in the combined document, of ``fragment`` on ``page`` (the page's own top when empty)."""
    name = page.removesuffix(".html").replace("/", "-")
    return f"{name}--{fragment}" if fragment else name


def page_section(page: str, pages: list[str], html_dir: Path = HTML) -> str:
    """One page's article as a ``<section>`` of the combined document: ids prefixed, links between the book's
    pages turned into links inside the document, interactive figures reduced to their default frame."""
    soup = BeautifulSoup((html_dir / page).read_text(encoding="utf8"), "html.parser")
    article = soup.select_one("article.bd-article")
    if article is None:
        raise SystemExit(f"{page}: no <article class='bd-article'>; is {html_dir} a build of this book?")
    for img in article.select(".tl-fig-frames img[hidden]"):
        img.decompose()
    for el in article.find_all(id=True):
        el["id"] = anchor(page, el["id"])
    for a in article.find_all("a", href=True):
        target = urlparse(urljoin(page, a["href"]))
        if target.scheme or target.netloc:
            continue
        if target.path in pages:
            a["href"] = "#" + anchor(target.path, target.fragment)
    return f'<section class="tl-pdf-page" id="{anchor(page)}">{article.decode_contents()}</section>'


def combined_document(pages: list[str], html_dir: Path = HTML) -> str:
    """The whole book as one HTML page: the first page's <head> (stylesheets, MathJax), every page's article."""
    head = BeautifulSoup((html_dir / pages[0]).read_text(encoding="utf8"), "html.parser").head
    sections = "\n".join(page_section(p, pages, html_dir) for p in pages)
    return (f'<!DOCTYPE html><html lang="en" data-theme="light" data-mode="light">{head}'
            f"<style>{PRINT_CSS}</style><body>"
            '<div class="bd-container"><div class="bd-container__inner bd-page-width"><div class="bd-main">'
            '<div class="bd-content"><div class="bd-article-container">'
            f'<article class="bd-article" role="main">{sections}</article>'
            "</div></div></div></div></div></body></html>")


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args):
        pass


def print_pdf(out: Path = OUT, html_dir: Path = HTML) -> Path:
    """Write the PDF of the built site to ``out`` (atomically) and return its path."""
    from playwright.sync_api import sync_playwright

    if not (html_dir / "index.html").is_file():
        raise SystemExit(f"no website in {html_dir}: run `make book` first")
    if not CHROMIUM.exists():
        raise SystemExit(f"{CHROMIUM} is missing: run `make chromium` first")
    pages = reading_order(html_dir)
    document = combined_document(pages, html_dir)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0),
                                            functools.partial(_QuietHandler, directory=str(html_dir)))
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    server = f"http://127.0.0.1:{httpd.server_address[1]}"
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".pdf.tmp")
    try:
        with sync_playwright() as p:
            browser = p.chromium.launch(executable_path=str(CHROMIUM), args=ARGS)
            page = browser.new_page(viewport={"width": 1000, "height": 1400})
            page.route("**/*", lambda r: (r.fulfill(body=document, content_type="text/html; charset=utf-8")
                                          if r.request.url == f"{server}/{COMBINED}"
                                          else r.continue_() if r.request.url.startswith(server) else r.abort()))
            page.goto(f"{server}/{COMBINED}", wait_until="load", timeout=120_000)
            page.wait_for_function("() => window.MathJax && MathJax.startup && MathJax.startup.promise",
                                   timeout=60_000)
            page.evaluate("() => MathJax.startup.promise")
            page.evaluate("() => document.fonts.ready.then(() => true)")
            page.emulate_media(media="print")
            page.pdf(path=str(tmp), format="A4", print_background=True, outline=True, tagged=True,
                     display_header_footer=True, header_template="<span></span>", footer_template=FOOTER,
                     margin={"top": "16mm", "bottom": "16mm", "left": "14mm", "right": "14mm"})
            browser.close()
    finally:
        httpd.shutdown()
    tmp.replace(out)
    return out


def main() -> int:
    t0 = time.perf_counter()
    out = print_pdf()
    print(f"wrote {out.relative_to(ROOT)} ({out.stat().st_size / 1e6:.1f} MB) from {len(reading_order())} pages "
          f"in {time.perf_counter() - t0:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
