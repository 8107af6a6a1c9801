"""One reveal.js deck per chapter, generated from the chapter's source, so the slides follow the text.

    python tools/slides.py OUT_DIR [--executed _build/jupyter_execute] [--vendor ../_static/vendor]

The chapter's own structure says what goes on a slide; nothing is tagged or copied by hand:

* title slide: the chapter's title and the seed's claim (the block quote under the title);
* one slide per section (``##``) that has something to show: its display equations (at most two) and its first
  figure, as an image: a plain plot, or the default frame of an interactive figure (the one the text discusses);
* the verdict: the "What the seed gets wrong" note, when the chapter has one;
* one slide per exercise: its statement (no solution, no code).

Figures come from the executed notebooks MyST-NB writes (``_build/jupyter_execute/chapters/*.ipynb``); without
them the decks have no figures. reveal.js and MathJax are the site's own copies (``tools/fetch_assets.sh``),
found at ``--vendor`` relative to the deck: nothing is loaded from another host.
"""

from __future__ import annotations

import argparse
import html
import re
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parent.parent
MAX_EQUATIONS = 2  # per section slide
_DISPLAY = re.compile(r"^\$\$\n?(.*?)\n?\$\$", re.S | re.M)
_DIRECTIVE = re.compile(r"^(`{3,}|:{3,})\{(exercise|admonition)\}([^\n]*)\n(.*?)^\1[ \t]*$", re.S | re.M)
_FRAME = re.compile(r'<img(?![^>]*\bhidden\b)[^>]*\bsrc="(data:image/png;base64,[^"]+)"')


def inline(text: str) -> str:
    """Markdown/MyST inline text as HTML: roles to their text, `code`, **bold**, *italic*; $math$ left for MathJax."""
    text = re.sub(r"\{(?:doc|ref|numref|eq)\}`([^`<]*?)(?:\s*<[^>]*>)?`", r"\1", text)
    text = re.sub(r"\{cite(?::\w+)?\}`([^`]*)`", r"[\1]", text)
    text = html.escape(text, quote=False)
    text = re.sub(r"`([^`]+)`", r"<code>\1</code>", text)
    text = re.sub(r"\*\*(.+?)\*\*", r"<strong>\1</strong>", text)
    return re.sub(r"(?<![*\w])\*(?!\s)(.+?)(?<!\s)\*(?!\w)", r"<em>\1</em>", text)


def paragraphs(text: str) -> str:
    body = [ln for ln in text.splitlines() if not re.match(r"^:\w[\w-]*:", ln)]  # directive options
    return "".join(f"<p>{inline(' '.join(p.split()))}</p>" for p in "\n".join(body).split("\n\n") if p.strip())


class Deck:
    """The slides of one chapter, gathered while walking its cells in order."""

    def __init__(self) -> None:
        self.title, self.claim = "", ""
        self.sections: list[dict] = []
        self.verdict, self.exercises = "", []

    def markdown(self, source: str) -> None:
        for m in _DIRECTIVE.finditer(source):
            if m[2] == "exercise":
                self.exercises.append(paragraphs(m[4]))
            elif "seed gets wrong" in m[3]:
                self.verdict = paragraphs(m[4].split("\n\n")[0] if not m[4].startswith(":") else
                                          m[4].split("\n\n", 2)[1])
        prose = _DIRECTIVE.sub("", source)
        if not self.title and (h1 := re.search(r"^# (.+)$", prose, re.M)):
            self.title = inline(h1[1])
            quote = re.search(r"^((?:>.*\n?)+)", prose[h1.end():].lstrip("\n"), re.M)
            if quote:
                self.claim = paragraphs(re.sub(r"^> ?", "", quote[1], flags=re.M))
        for part in re.split(r"^(?=## )", prose, flags=re.M):
            if part.startswith("## "):
                self.sections.append({"title": inline(part.splitlines()[0][3:]), "equations": [], "figure": None})
            if self.sections:
                eqs = self.sections[-1]["equations"]
                eqs.extend(m[1].strip() for m in _DISPLAY.finditer(part) if len(eqs) < MAX_EQUATIONS)
                del eqs[MAX_EQUATIONS:]

    def outputs(self, outputs: list) -> None:
        if not self.sections or self.sections[-1]["figure"]:
            return
        for out in outputs:
            data = out.get("data", {})
            frame = _FRAME.search(data.get("text/html", "")) if "tl-fig" in data.get("text/html", "") else None
            if frame:
                self.sections[-1]["figure"] = frame[1]
            elif "image/png" in data:
                self.sections[-1]["figure"] = "data:image/png;base64," + data["image/png"].replace("\n", "")
            if self.sections[-1]["figure"]:
                return

    def slides(self) -> list[str]:
        out = [f"<h2>{self.title}</h2><blockquote class='claim'>{self.claim}</blockquote>"]
        for s in self.sections:
            if not (s["equations"] or s["figure"]):
                continue
            parts = [f"<h3>{s['title']}</h3>"] + [f"<div class='eq'>$${html.escape(e)}$$</div>" for e in s["equations"]]
            if s["figure"]:
                parts.append(f"<img class='fig' src='{s['figure']}' alt='figure: {s['title']}'>")
            out.append("".join(parts))
        if self.verdict:
            out.append(f"<h3>What the seed gets wrong</h3>{self.verdict}")
        out += [f"<h3>Exercise {i}</h3>{text}" for i, text in enumerate(self.exercises, 1)]
        return out


def deck_for(page: Path, executed: Path | None) -> Deck:
    nb = nbformat.read(executed, as_version=4) if executed and executed.is_file() else jupytext.read(page)
    deck = Deck()
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            deck.markdown(cell.source)
        elif cell.cell_type == "code":
            deck.outputs(cell.get("outputs", []))
    return deck


def render(deck: Deck, vendor: str) -> str:
    slides = "\n".join(f"<section>{s}</section>" for s in deck.slides())
    title = re.sub(r"<[^>]+>", "", deck.title)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title} (slides)</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="{vendor}/reveal.js/dist/reveal.css">
<link rel="stylesheet" href="{vendor}/reveal.js/dist/theme/white.css">
<style>.reveal h2,.reveal h3{{text-transform:none}} .reveal section{{font-size:0.62em}}
.reveal img.fig{{max-height:55vh;margin:0.3em auto}} .reveal blockquote.claim{{width:90%;font-size:0.8em}}
.reveal .eq{{font-size:0.9em}}</style></head>
<body><div class="reveal"><div class="slides">
{slides}
</div></div>
<script src="{vendor}/reveal.js/dist/reveal.js"></script>
<script src="{vendor}/reveal.js/plugin/math/math.js"></script>
<script>Reveal.initialize({{hash: true, controls: true, progress: true, plugins: [RevealMath.MathJax3],
  mathjax3: {{mathjax: "{vendor}/mathjax/tex-chtml.js",
             tex: {{inlineMath: [["$", "$"], ["\\\\(", "\\\\)"]], displayMath: [["$$", "$$"]]}}}}}});</script>
</body></html>
"""


def write_decks(out_dir: Path, *, root: Path = ROOT, executed: Path | None = None,
                vendor: str = "../_static/vendor") -> list[Path]:
    """Write ``out_dir/NN-name.html`` for every chapter; return the paths."""
    from course_notebooks import chapter_pages

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for page in chapter_pages(root):
        path = out_dir / f"{page.stem}.html"
        ran = executed / "chapters" / f"{page.stem}.ipynb" if executed else None
        path.write_text(render(deck_for(page, ran), vendor), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--executed", type=Path, default=ROOT / "_build" / "jupyter_execute")
    parser.add_argument("--vendor", default="../_static/vendor")
    args = parser.parse_args()
    for p in write_decks(args.out, executed=args.executed, vendor=args.vendor):
        print(f"wrote {p}")
