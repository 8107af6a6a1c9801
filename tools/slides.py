"""One reveal.js deck per chapter, generated from the chapter's source, so the slides follow the text.

    python tools/slides.py OUT_DIR [--executed _build/jupyter_execute] [--vendor ../_static/vendor]

The chapter's own structure says what goes on a slide; nothing is tagged or copied by hand. Each section (``##``)
and subsection (``###``) gives, in order:

* its key idea: the heading and the first two sentences of its first paragraph (the book's sections open with
  their idea), with the rest of its prose as the speaker notes (``<aside class="notes">``, reveal.js's notes
  plugin: press S);
* its further points, stepped: the first sentence of each later paragraph as a bullet, up to five a slide, each
  shown one at a time (reveal.js fragments), the paragraphs themselves as the notes;
* its display equations, stepped the same way, up to three a slide, the paragraph that introduces them as the notes;
* each derivation its code displays (the lines ``show_steps``/``show_equations`` print, SymPy's results, as
  ``text/latex`` or Markdown maths), one line at a time, up to five a slide;
* every figure, one a slide: a plain plot, or the default frame of an interactive figure;
* its first table of computed numbers, as a worked example (a chapter without tables: the first two sentences its
  code writes with computed numbers in them).

Around them: the title slide with the seed's claim, a "Session 2" slide at the section boundary nearest the middle
(two 90-minute sessions), the "What the seed gets wrong" verdict, and one slide per exercise: its statement only.
The exercises section (solutions included) gives nothing else, so a deck never shows a solution.

The text is always the chapter's own source. Figures, derivations and tables are the outputs its code had when
the book was built, found by each cell's code: in the executed notebook MyST-NB writes
(``_build/jupyter_execute/chapters/*.ipynb``) and, for cells it lacks, in MyST-NB's execution cache
(``_build/.jupyter_cache``); without either the decks have none. Cells tagged ``remove-cell``, ``remove-output`` or
``solution`` give nothing. reveal.js and MathJax are the site's own copies (``tools/fetch_assets.sh``),
found at ``--vendor`` relative to the deck: nothing is loaded from another host. A line of maths wider than the
slide is scaled down to its width; a slide whose content is still taller or wider shrinks its text (down to half)
until it fits.
"""

from __future__ import annotations

import argparse
import html
import re
from pathlib import Path

import jupytext
import nbformat

ROOT = Path(__file__).resolve().parent.parent
EQUATIONS_PER_SLIDE = 3
POINTS_PER_SLIDE = 5
STEPS_PER_SLIDE = 5  # lines of a derivation the code displays (SymPy), stepped
TABLES_PER_SECTION = 1  # the section's first table of computed numbers: its worked example
CLAIMS_WITHOUT_TABLES = 2  # a chapter without tables: its first sentences of computed numbers, as worked examples
_DERIVATION_NOTE = ("Each line is a SymPy result computed when the book was built; step through them and "
                    "ask what was done between one line and the next.")
_DISPLAY = re.compile(r"^\$\$\n?(.*?)\n?\$\$", re.S | re.M)
_DIRECTIVE = re.compile(r"^(`{3,}|:{3,})\{(exercise|admonition|solution-start|solution-end)\}([^\n]*)\n(.*?)^\1[ \t]*$",
                        re.S | re.M)
_FRAME = re.compile(r'<img(?![^>]*\bhidden\b)[^>]*\bsrc="(data:image/png;base64,[^"]+)"')
_TABLE = re.compile(r"<table\b.*?</table>", re.S)
_SENTENCE = re.compile(r"(?<=[.!?])\s+(?=[A-Z$`*(])")
_HIDDEN_SECTIONS = ("Exercises",)  # nothing but the exercise statements from these


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


def _prose(text: str) -> list[str]:
    """The paragraphs of a stretch of Markdown without headings, fences and display maths, each on one line."""
    text = re.sub(r"^(`{3,}).*?^\1[ \t]*$", "", text, flags=re.S | re.M)
    return [" ".join(p.split()) for p in text.split("\n\n")
            if p.strip() and not p.lstrip().startswith(("#", "$$", "<", "|", ":::"))]


class Deck:
    """The slides of one chapter, gathered while walking its cells in order."""

    def __init__(self) -> None:
        self.title, self.claim = "", ""
        self.blocks: list[dict] = []  # {"title", "level", "prose": [...], "items": [(kind, content, lead)]}
        self.verdict, self.exercises = "", []

    @property
    def _hidden(self) -> bool:
        tops = [b for b in self.blocks if b["level"] == 2]
        return bool(tops) and tops[-1]["plain"] in _HIDDEN_SECTIONS

    def markdown(self, source: str) -> None:
        for m in _DIRECTIVE.finditer(source):
            if m[2] == "exercise":
                self.exercises.append(paragraphs(m[4]))
            elif m[2] == "admonition" and "seed gets wrong" in m[3]:
                self.verdict = paragraphs(m[4].split("\n\n")[0] if not m[4].startswith(":") else
                                          m[4].split("\n\n", 2)[1])
        prose = _DIRECTIVE.sub("", source)
        if not self.title and (h1 := re.search(r"^# (.+)$", prose, re.M)):
            self.title = inline(h1[1])
            quote = re.search(r"^((?:>.*\n?)+)", prose[h1.end():].lstrip("\n"), re.M)
            if quote:
                self.claim = paragraphs(re.sub(r"^> ?", "", quote[1], flags=re.M))
            return
        for part in re.split(r"^(?=#{2,3} )", prose, flags=re.M):
            if head := re.match(r"^(#{2,3}) (.+)$", part, re.M):
                self.blocks.append({"title": inline(head[2]), "plain": head[2].strip(), "level": len(head[1]),
                                    "prose": [], "items": []})
                part = part[head.end():]
            if not self.blocks or self._hidden:
                continue
            block = self.blocks[-1]
            pos = 0
            for m in _DISPLAY.finditer(part):  # the paragraph before an equation introduces it
                block["prose"] += _prose(part[pos:m.start()])
                block["items"].append(("eq", f"$${html.escape(m[1].strip())}$$",
                                       block["prose"][-1] if block["prose"] else ""))
                pos = m.end()
            block["prose"] += _prose(part[pos:])

    def outputs(self, outputs: list) -> None:
        if not self.blocks or self._hidden:
            return
        block = self.blocks[-1]
        lead = block["prose"][-1] if block["prose"] else ""
        steps = []  # one cell's derivation: the lines show_steps / show_equations display
        for out in outputs:
            data = out.get("data", {})
            page = data.get("text/html", "")
            frame = _FRAME.search(page) if "tl-fig" in page else None
            tables = sum(kind == "table" for kind, _, _ in block["items"])
            if frame:
                block["items"].append(("fig", frame[1], lead))
            elif "image/png" in data:
                block["items"].append(("fig", "data:image/png;base64," + data["image/png"].replace("\n", ""), lead))
            elif (table := _TABLE.search(page)) and tables < TABLES_PER_SECTION:
                block["items"].append(("table", table[0], lead))
            elif (tex := data.get("text/latex", "")).strip().startswith("$"):
                steps.append(_display(tex))
            elif _is_derivation(md := data.get("text/markdown", "")):  # a SymPy result the code displays
                steps.append(inline(" ".join(md.split())))
            elif re.search(r"\d\.\d", md) and len(md) < 900:  # a sentence stating numbers the code computed
                block["items"].append(("claim", paragraphs(md), lead))
        if steps:
            block["items"].append(("steps", steps, lead))

    def sections(self) -> list[tuple[int, list[str]]]:
        """(level, slides) for each block, in order."""
        out = []
        tables = any(kind == "table" for b in self.blocks for kind, _, _ in b["items"])
        claims = 0 if tables else CLAIMS_WITHOUT_TABLES  # no table: the numbers the text states are the example
        for b in self.blocks:
            if b["plain"] in _HIDDEN_SECTIONS or not b["prose"]:
                continue
            first = _SENTENCE.split(b["prose"][0])
            idea, rest = " ".join(first[:2]), " ".join(first[2:])
            slides = [f"<h3>{b['title']}</h3><p class='idea'>{inline(idea)}</p>{_notes([rest or idea])}"]
            later = b["prose"][1:]
            for k in range(0, len(later), POINTS_PER_SLIDE):
                chunk = later[k:k + POINTS_PER_SLIDE]
                points = "".join(f"<li class='fragment'>{inline(_SENTENCE.split(p)[0])}</li>" for p in chunk)
                slides.append(f"<h4>{b['title']}</h4><ul>{points}</ul>{_notes(chunk)}")
            eqs = [(c, lead) for kind, c, lead in b["items"] if kind == "eq"]
            for k in range(0, len(eqs), EQUATIONS_PER_SLIDE):
                chunk = eqs[k:k + EQUATIONS_PER_SLIDE]
                steps = "".join(f"<div class='eq fragment'>{e}</div>" for e, _ in chunk)
                leads = list(dict.fromkeys(lead for _, lead in chunk if lead)) or [idea]
                slides.append(f"<h4>{b['title']}</h4>{steps}{_notes(leads)}")
            for kind, content, lead in b["items"]:
                if kind == "steps":
                    for k in range(0, len(content), STEPS_PER_SLIDE):
                        more = " (continued)" if k else ""
                        steps = "".join(f"<div class='eq step fragment'>{e}</div>" for e in
                                        content[k:k + STEPS_PER_SLIDE])
                        slides.append(f"<h4>Derivation{more}: {b['title']}</h4>{steps}"
                                      f"{_notes([lead or idea, _DERIVATION_NOTE])}")
                elif kind == "fig":
                    slides.append(f"<h4>{b['title']}</h4><img class='fig' src='{content}' alt='figure: "
                                  f"{html.escape(b['plain'])}'>{_notes([lead or idea])}")
                elif kind == "claim" and claims:
                    claims -= 1
                    slides.append(f"<h4>Worked example: {b['title']}</h4><div class='claim'>{content}</div>"
                                  f"{_notes([lead or idea])}")
                elif kind == "table":
                    slides.append(f"<h4>Worked example: {b['title']}</h4><div class='table'>{content}</div>"
                                  f"{_notes([lead or idea])}")
            out.append((b["level"], slides))
        return out

    def slides(self) -> list[str]:
        body = self.sections()
        total, half, seen, marker = sum(len(s) for _, s in body), 0, 0, None
        for i, (level, slides) in enumerate(body):  # the section boundary nearest the middle
            if level == 2 and (marker is None or abs(seen - total / 2) < abs(half - total / 2)):
                marker, half = i, seen
            seen += len(slides)
        out = [f"<h2>{self.title}</h2><blockquote class='claim'>{self.claim}</blockquote>"
               f"{_notes(['The seed claim this chapter makes concrete, and corrects where it is loose.'])}"]
        for i, (_, slides) in enumerate(body):
            if i == marker and i > 0:
                out.append(f"<h2>Session 2</h2><p>{self.title}</p>{_notes(['Second 90-minute session.'])}")
            out += slides
        if self.verdict:
            out.append(f"<h3>What the seed gets wrong</h3>{self.verdict}{_notes(['The verdict on the seed.'])}")
        out += [f"<h3>Exercise {i}</h3>{text}{_notes(['Statement only; the solutions are in the book.'])}"
                for i, text in enumerate(self.exercises, 1)]
        return out


def _display(tex: str) -> str:
    """A ``text/latex`` output (``$\\displaystyle …$``) as display maths."""
    tex = tex.strip().strip("$").replace("\\displaystyle", "").strip()
    return f"$${html.escape(tex, quote=False)}$$"


def _is_derivation(md: str) -> bool:
    """A Markdown output that is mostly maths with a command in it (a derivation's result), not a sentence."""
    words = re.sub(r"\$\$?.+?\$\$?", "", md, flags=re.S)
    return "$" in md and "\\" in md and len(md) < 800 and len(words.strip()) < 0.3 * len(md)


def _notes(paras: list[str]) -> str:
    return "<aside class='notes'>" + "".join(f"<p>{inline(p)}</p>" for p in paras if p) + "</aside>"


_SKIP_TAGS = {"remove-cell", "remove-output", "solution"}


def _outputs_by_code(nb) -> dict[str, list]:
    return {c.source.strip(): c.get("outputs", []) for c in nb.cells if c.cell_type == "code" and c.get("outputs")}


def _ran(page: Path, executed: Path | None, cache: Path | None) -> dict[str, list]:
    """The outputs each code cell of ``page`` had when it ran, by its code: from the executed notebook MyST-NB
    wrote, and for cells it lacks, from MyST-NB's execution cache (the record of this exact notebook, else the
    newest record of the page, for the cells whose code has not changed since)."""
    found: dict[str, list] = {}
    if cache and (cache / "global.db").is_file():
        try:
            from jupyter_cache import get_cache

            db = get_cache(cache)
            try:
                record = db.match_cache_notebook(jupytext.read(page))
            except KeyError:
                records = [r for r in db.list_cache_records() if Path(r.uri).name == page.name]
                record = max(records, key=lambda r: r.created) if records else None
            if record is not None:
                found.update(_outputs_by_code(db.get_cache_bundle(record.pk).nb))
        except Exception as err:  # a cache of another version is no reason to fail the build
            print(f"slides: execution cache not read for {page.name}: {err}")
    if executed and executed.is_file():
        found.update(_outputs_by_code(nbformat.read(executed, as_version=4)))
    return found


def deck_for(page: Path, executed: Path | None, cache: Path | None = None) -> Deck:
    """The deck of one chapter: its text from the chapter itself, its figures and SymPy results from the outputs
    its code had when the book was built (``executed``, the notebook MyST-NB wrote, and ``cache``, its cache)."""
    nb, ran = jupytext.read(page), _ran(page, executed, cache)
    deck = Deck()
    for cell in nb.cells:
        if cell.cell_type == "markdown":
            deck.markdown(cell.source)
        elif cell.cell_type == "code" and not _SKIP_TAGS & set(cell.metadata.get("tags", [])):
            deck.outputs(ran.get(cell.source.strip(), []))
    return deck


def render(deck: Deck, vendor: str) -> str:
    slides = "\n".join(f"<section>{s}</section>" for s in deck.slides())
    title = re.sub(r"<[^>]+>", "", deck.title)
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{title} (slides)</title>
<meta name="viewport" content="width=device-width, initial-scale=1">
<link rel="stylesheet" href="{vendor}/reveal.js/dist/reveal.css">
<link rel="stylesheet" href="{vendor}/reveal.js/dist/theme/white.css">
<style>.reveal h2,.reveal h3,.reveal h4{{text-transform:none}} .reveal section{{font-size:0.62em}}
.reveal p.idea{{font-size:1.3em;text-align:left}} .reveal ul{{display:block;font-size:1.1em}}
.reveal img.fig{{height:540px;max-width:96%;object-fit:contain;margin:0.3em auto}}
.reveal blockquote.claim{{width:90%;font-size:0.8em}} .reveal .eq{{font-size:0.9em;overflow:hidden}}
.reveal .table table{{font-size:0.8em;margin:0 auto}}
.reveal .table td,.reveal .table th{{padding:0.15em 0.4em}}</style>
</head>
<body><div class="reveal"><div class="slides">
{slides}
</div></div>
<script src="{vendor}/reveal.js/dist/reveal.js"></script>
<script src="{vendor}/reveal.js/plugin/math/math.js"></script>
<script src="{vendor}/reveal.js/plugin/notes/notes.js"></script>
<script>
function fit(slide) {{  // shrink the text of a slide taller or wider than the slide, down to half
  if (!slide) return;
  const {{width, height}} = Reveal.getConfig();
  let scale = 1;
  slide.style.fontSize = "";
  for (const eq of slide.querySelectorAll(".eq")) {{  // a line of maths wider than the slide: that line scales down
    const math = eq.querySelector("mjx-math");
    if (!math) continue;
    math.style.transform = "";
    if (math.offsetWidth > 0.96 * width) {{
      math.style.transformOrigin = "0 50%";
      math.style.transform = `scale(${{0.96 * width / math.offsetWidth}})`;
    }}
  }}
  while ((slide.scrollHeight > height || slide.scrollWidth > width) && scale > 0.5) {{
    scale -= 0.05;
    slide.style.fontSize = (0.62 * scale) + "em";
  }}
}}
Reveal.initialize({{hash: true, controls: true, progress: true, width: 1280, height: 720,
  plugins: [RevealMath.MathJax3, RevealNotes],
  mathjax3: {{mathjax: "{vendor}/mathjax/tex-chtml.js",
             tex: {{inlineMath: [["$", "$"], ["\\\\(", "\\\\)"]], displayMath: [["$$", "$$"]]}}}}}});
Reveal.on("ready", e => fit(e.currentSlide));
Reveal.on("slidechanged", e => fit(e.currentSlide));
window.addEventListener("load", () => window.MathJax && MathJax.startup &&
  MathJax.startup.promise.then(() => fit(Reveal.getCurrentSlide())));
</script>
</body></html>
"""


def write_decks(out_dir: Path, *, root: Path = ROOT, executed: Path | None = None,
                cache: Path | None = None, vendor: str = "../_static/vendor") -> list[Path]:
    """Write ``out_dir/NN-name.html`` for every chapter; return the paths."""
    from course_notebooks import chapter_pages

    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for page in chapter_pages(root):
        path = out_dir / f"{page.stem}.html"
        ran = executed / "chapters" / f"{page.stem}.ipynb" if executed else None
        path.write_text(render(deck_for(page, ran, cache), vendor), encoding="utf-8")
        written.append(path)
    return written


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path)
    parser.add_argument("--executed", type=Path, default=ROOT / "_build" / "jupyter_execute")
    parser.add_argument("--cache", type=Path, default=ROOT / "_build" / ".jupyter_cache")
    parser.add_argument("--vendor", default="../_static/vendor")
    args = parser.parse_args()
    for p in write_decks(args.out, executed=args.executed, cache=args.cache, vendor=args.vendor):
        print(f"wrote {p}")
