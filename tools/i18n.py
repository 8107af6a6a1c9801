"""The Chinese edition: Sphinx's gettext workflow on the book's own sources.

    python tools/i18n.py update     # after an English edit: new message templates, then `sphinx-intl update`
    python tools/i18n.py stats      # the share of translated messages, page by page
    python tools/i18n.py todo chapters/01-linear-algebra > todo.json     # a page's untranslated messages
    python tools/i18n.py fill chapters/01-linear-algebra done.json       # {English: Chinese} into its catalogue
    python tools/i18n.py check [PAGE ...]   # what a translation must keep (math, code, targets, numbers, terms)
    python tools/i18n.py pairs chapters/01-linear-algebra > pairs.json   # {English: Chinese}, for a reviewer

Every paragraph, heading, list item, caption and exercise statement of a page is one message; its translation lives
in ``locales/zh_CN/LC_MESSAGES/<page>.po`` (one catalogue per page). Code, outputs and figures are shared: the
Chinese site is built from the same sources and the same execution cache as the English one, with
``language: zh_CN``, and ends up in ``_build/html/zh`` (``tools/build.py`` calls :func:`build` after the English
build). A message whose English changed comes back from ``sphinx-intl update`` marked fuzzy (its old translation
kept as a hint); until it is translated again the page shows the English sentence, and ``tests/test_translation.py``
fails.
"""

from __future__ import annotations

import html
import json
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
LANGUAGE = "zh_CN"
CATALOGUES = ROOT / "locales" / LANGUAGE / "LC_MESSAGES"
POT_BUILD = ROOT / "_build" / "i18n"              # the gettext build (its own parsed pages: Sphinx keeps them apart)
TEMPLATES = POT_BUILD / "_build" / "gettext"      # the .pot files: one per page, from the current sources
GLOSSARY = ROOT / "locales" / LANGUAGE / "glossary.tsv"   # the book's terms: English, Chinese, enforced or not
OUT = ROOT / "_build" / "zh"                      # Jupyter Book's output folder for the Chinese build
SEARCH_WORDS = OUT / "search-words.txt"          # jieba's user dictionary (the glossary's terms), for search
SITE = ROOT / "_build" / "html" / "zh"            # where the Chinese site is served, beside the English one


# ------------------------------------------------------------------ what a translation must keep
MATH = re.compile(r"\$\$.+?\$\$|\$[^$\n]+?\$", re.S)
ROLE = re.compile(r"\{([\w:-]+)\}`([^`]*)`")
CODE = re.compile(r"``?[^`]+?``?")
LINK = re.compile(r"\]\(([^)\s]+)\)")
SUBSTITUTION = re.compile(r"\{\{\s*\w+\s*\}\}")
NUMBER = re.compile(r"(?<![\w.])\d+(?:,\d{3})*(?:\.\d+)?")
# A number as the code prints it, in any of its forms: sign, thousands separators, decimals, exponent (1.4e-06,
# -0.0, 2.5e+03, 0.6). Another machine's round-off can print another form in the same place (0 here, 1.4e-06
# there), so a sentence's skeleton blanks each whole numeral, whatever its form.
NUMERAL = re.compile(r"(?<![\w.])[-+\u2212]?\d+(?:,\d{3})*(?:\.\d+)?(?:[eE][-+\u2212]?\d+)?")
CJK = re.compile(r"[\u3400-\u9fff]")
FULL_WIDTH = re.compile(r"[\u3000-\u303f\uff01-\uff5e]")  # Chinese punctuation: ，。：（）


def _target(role: str, body: str) -> tuple[str, str]:
    """A role's target: ``{ref}`text <target>``` and ``{ref}`target``` both name ``target``."""
    inner = re.search(r"<([^<>]+)>\s*$", body)
    return role, (inner.group(1) if inner else body).strip()


TEXT_IN_MATH = re.compile(r"\\text\{[^{}]*\}")


def _math(tex: str) -> str:
    """A formula as a translation must keep it: its ``\\text{...}`` labels may be translated."""
    return TEXT_IN_MATH.sub(r"\\text{}", tex)


def parts(text: str) -> dict[str, list]:
    """What a translation copies unchanged: math (but for its text labels), role targets, inline code, link
    targets, substitutions; and the numbers of the prose outside them (thousands separators dropped)."""
    math = [_math(m) for m in MATH.findall(text)]
    rest = MATH.sub(" ", text)
    roles = [_target(*r) for r in ROLE.findall(rest)]
    rest = ROLE.sub(" ", rest)
    code = CODE.findall(rest)
    rest = CODE.sub(" ", rest)
    links = LINK.findall(rest)
    rest = LINK.sub(" ", rest)
    subs = SUBSTITUTION.findall(rest)
    rest = SUBSTITUTION.sub(" ", rest)
    numbers = [n.replace(",", "") for n in NUMBER.findall(rest)]
    return {"math": sorted(math), "roles": sorted(roles), "code": sorted(code), "links": sorted(links),
            "substitutions": sorted(subs), "numbers": numbers, "prose": rest}


def is_math(text: str) -> bool:
    """A display equation's message: TeX alone, as a ``$$`` block or a SymPy result gives it (no dollar signs; it
    starts with a line break or a TeX command, which no sentence of the book does)."""
    return "$" not in text and text.startswith(("\n", "\\"))


def nothing_to_translate(text: str) -> bool:
    """True for a message a translation copies whole: math or code alone, or text that is already Chinese (the
    seed's quotations)."""
    if is_math(text):
        return True
    prose = parts(text)["prose"]
    cjk, letters = len(CJK.findall(prose)), len(re.findall(r"[A-Za-z]", prose))
    return (not re.search(r"[A-Za-z]{2,}", prose) or (cjk >= 6 and 3 * cjk >= letters)
            or (cjk >= 4 and bool(FULL_WIDTH.search(prose)) and bool(CJK.match(re.sub(r"[\W\d_]+", "", prose)))))


def skeleton(text: str) -> str:
    """A message with its numbers blanked, whatever their form (:data:`NUMERAL`): two sentences the code wrote with
    other numbers share it."""
    return NUMERAL.sub("#", text)


def by_skeleton(translations: dict[str, str]) -> dict[str, tuple[str, str]]:
    """{skeleton: (English, translation)} of the translated messages, the first of those that share a skeleton:
    the index :func:`renumbered` looks a sentence up in."""
    index: dict[str, tuple[str, str]] = {}
    for en, zh in translations.items():
        if zh:
            index.setdefault(skeleton(en), (en, zh))
    return index


def renumbered(msgid: str, index: dict[str, tuple[str, str]]) -> str | None:
    """The translation of a sentence that the code wrote with numbers other than those of its translated version
    (a measured time, a loss after a re-execution, another machine's round-off): the translation of the message
    with the same words (found in ``index``, :func:`by_skeleton`), with the new numbers in place. Where the
    translation keeps the English's numbers in the English's order, each takes the new number of its place (so
    two equal old numbers may become two different ones); otherwise each old number is replaced by the new number
    in the same place of the English. None when there is no such message, or when, in that second case, one old
    number would become two different new ones."""
    if (found := index.get(skeleton(msgid))) is None:
        return None
    old_id, old = found
    old_numbers, new_numbers = NUMERAL.findall(old_id), NUMERAL.findall(msgid)
    if [n.replace(",", "") for n in NUMERAL.findall(old)] == [n.replace(",", "") for n in old_numbers]:
        in_order = iter(new_numbers)
        return NUMERAL.sub(lambda m: next(in_order), old)
    new_of: dict[str, str] = {}
    for a, b in zip(old_numbers, new_numbers, strict=True):
        if new_of.setdefault(a.replace(",", ""), b) != b:
            return None
    return NUMERAL.sub(lambda m: new_of.get(m.group().replace(",", ""), m.group()), old)


def _glossary_rows() -> list[list[str]]:
    return [[*(cell.strip() for cell in line.split("\t")), "", ""][:4]
            for line in GLOSSARY.read_text().splitlines() if line.strip() and not line.startswith("#")]


def glossary() -> list[tuple[str, str, bool]]:
    """(English term, Chinese term, enforced) from ``glossary.tsv``; an enforced term's English in a message (a
    whole word, plural allowed) requires its Chinese in the translation."""
    return [(en, zh, rule == "enforced") for en, zh, rule, _ in _glossary_rows()]


def variants() -> dict[str, str]:
    """{other rendering: the book's term} from ``glossary.tsv``'s fourth column: renderings of a term that the
    book does not use, so that one idea keeps one name across the chapters."""
    return {v.strip(): zh for _, zh, _, others in _glossary_rows() for v in others.split(",") if v.strip()}


def _word(term: str) -> str:
    return rf"(?<![\w-]){re.escape(term)}(?:s|es)?(?![\w-])"


SEED = ROOT / "locales" / "zh_CN" / "seed.zh.txt"  # the Chinese essay the book grew from, as written
# the book's own quoted phrases that resemble a line of the seed
NOT_THE_SEED = {"嵌入查找 = 独热向量 × 矩阵", "每个技巧是否都有数值原因"}


def _lcs(a: str, b: str) -> int:
    """The length of the longest common subsequence of ``a`` and ``b``."""
    row = [0] * (len(b) + 1)
    for x in a:
        diagonal, row[0] = 0, 0
        for j, y in enumerate(b, 1):
            diagonal, row[j] = row[j], diagonal + 1 if x == y else max(row[j], row[j - 1])
    return row[-1]


def seed_misquotes(msgstr: str) -> list[str]:
    """Chinese quotations “…” in a translation that echo a line of the seed without being its own words: at least
    four Chinese characters, most of them (55%) found in order in one line of the seed, yet not a run of the
    seed's characters (punctuation, spaces and Latin letters aside). A back-translation of the English gloss is
    the typical case: “Transformer 是一个神经概率语言模型” where the seed says 是一种“神经概率语言模型”."""
    hanzi = lambda s: "".join(CJK.findall(s))  # noqa: E731
    lines = [hanzi(line) for line in SEED.read_text(encoding="utf8").splitlines()]
    whole = "".join(lines)
    out = []
    for quote in re.findall(r"“([^”]+)”", msgstr):
        chars = hanzi(quote)
        if len(chars) < 4 or chars in whole or quote in NOT_THE_SEED:
            continue
        line = max(lines, key=lambda s: _lcs(chars, s))
        if _lcs(chars, line) >= 0.55 * len(chars):
            out.append(f"“{quote}” quotes the seed in other words; its line reads: {line}")
    return out


def problems(msgid: str, msgstr: str, terms: list[tuple[str, str, bool]] | None = None) -> list[str]:
    """What is wrong with one translation: untranslated, or a math, code, target, link or number of the English
    lost or changed, or an enforced term not rendered as the glossary says, ASCII quotation marks, or the seed
    quoted in other words."""
    if not msgstr:
        return ["not translated"]
    if is_math(msgid):
        return [] if _math(msgstr) == _math(msgid) else ["a formula: copied, only its \\text{} labels translated"]
    if nothing_to_translate(msgid):
        return [] if _math(msgstr) == _math(msgid) else ["math, code or the seed's Chinese: copied unchanged"]
    if msgstr == msgid and len(msgid.split()) > 3:  # a name of up to three words may stay (dropout, LayerNorm)
        return ["the English copied, not translated"]
    src, dst = parts(msgid), parts(msgstr)
    out = [f"{k}: the translation lacks {missing} of the English"
           for k in ("math", "roles", "code", "links", "substitutions")
           if (missing := [x for x in set(src[k]) if src[k].count(x) > dst[k].count(x)])]
    lost = [n for n in set(src["numbers"]) if src["numbers"].count(n) > dst["numbers"].count(n)]
    if lost:
        out.append(f"numbers of the English missing from the translation: {sorted(lost)}")
    terms = glossary() if terms is None else terms
    spans = [(m.span(), en) for en, _, _ in terms for m in re.finditer(_word(en), src["prose"], re.I)]
    for en, zh, enforced in terms:
        inside_longer = [s for s, other in spans if other != en and len(other) > len(en)]
        # "embedding" inside "rotary position embedding" is that term's, not its own
        alone = [s for s, other in spans if other == en and not any(a <= s[0] and s[1] <= b for a, b in inside_longer)]
        if enforced and alone and zh not in msgstr:
            out.append(f"the term “{en}” is rendered “{zh}” in this book (locales/zh_CN/glossary.tsv)")
    out += [f"“{v}”: this book writes “{zh}” (locales/zh_CN/glossary.tsv)" for v, zh in variants().items()
            if v in msgstr]
    if '"' in dst["prose"]:  # Sphinx's smart quotes turn "…" into ”…” on a Chinese page
        out.append('ASCII quotation marks "…": write Chinese ones “…”')
    return out + seed_misquotes(msgstr)


def pages(root: Path = CATALOGUES, suffix: str = ".po") -> list[str]:
    """The names of the pages that have a file ending in ``suffix`` under ``root``, e.g. ``chapters/08-mini-gpt``."""
    return sorted(f.relative_to(root).with_suffix("").as_posix() for f in root.rglob(f"*{suffix}"))


def _read(path: Path):
    from babel.messages.pofile import read_po

    with path.open("rb") as f:
        return read_po(f)


def catalogue(page: str):
    return _read(CATALOGUES / f"{page}.po")


def save(page: str, cat) -> None:
    from babel.messages.pofile import write_po

    with (CATALOGUES / f"{page}.po").open("wb") as f:
        write_po(f, cat, width=76)


def translations() -> dict[str, dict[str, str]]:
    """Every catalogue's translated messages, {page: {English: Chinese}}."""
    return {page: translated(page) for page in pages()}


def prefill(before: dict[str, dict[str, str]] | None = None) -> None:
    """After ``sphinx-intl update``: copy into every catalogue the messages with nothing to translate (math, code,
    Chinese quotations), and give a message that only changed its numbers (marked fuzzy by the update) the
    translation it had ``before`` the update, with the new numbers (:func:`renumbered`)."""
    for page in pages():
        cat, changed, old = catalogue(page), False, by_skeleton((before or {}).get(page, {}))
        for m in cat:
            if not m.id:
                continue
            if not m.string and nothing_to_translate(m.id):
                m.string, changed = m.id, True
            elif m.fuzzy and (new := renumbered(m.id, old)) is not None:
                m.string, changed = new, True
                m.flags.discard("fuzzy")
        if changed:
            save(page, cat)


def todo(page: str) -> int:
    """Print a page's messages that need a translation (missing or fuzzy) as JSON: {English: old translation}."""
    cat = catalogue(page)
    print(json.dumps({m.id: (m.string if m.fuzzy else "") for m in cat if m.id and (not m.string or m.fuzzy)},
                     ensure_ascii=False, indent=1))
    return 0


def translated(page: str) -> dict[str, str]:
    """A page's translated messages, {English: Chinese} (none fuzzy)."""
    return {m.id: m.string for m in catalogue(page) if m.id and m.string and not m.fuzzy}


def pairs(page: str) -> int:
    """Print a page's translated messages as JSON {English: Chinese}, in page order (math-only ones left out)."""
    cat = catalogue(page)
    print(json.dumps({m.id: m.string for m in cat if m.id and m.string and not is_math(m.id)},
                     ensure_ascii=False, indent=1))
    return 0


def fill(page: str, path: str) -> int:
    """Write the translations of a JSON file {English: Chinese} into a page's catalogue, then check the page."""
    given = json.loads(Path(path).read_text())
    cat, unknown = catalogue(page), []
    for en, zh in given.items():
        m = cat.get(en)
        if m is None:
            unknown.append(en)
            continue
        m.string = zh
        m.flags.discard("fuzzy")
    save(page, cat)
    for en in unknown:
        print(f"not a message of {page} (copy the English exactly, from `todo`): {en[:80]!r}", file=sys.stderr)
    left = sum(1 for m in cat if m.id and (not m.string or m.fuzzy))
    print(f"{len(given) - len(unknown)} translation(s) written to {page}; {left} message(s) of it still to translate")
    return check([page], only=set(given)) or (1 if unknown else 0)


def check(names: list[str], only: set[str] | None = None) -> int:
    """Print every problem of the pages' translations (all pages when none are named; of the messages ``only``
    when given); 1 if there are any."""
    terms, bad = glossary(), 0
    for page in names or pages():
        for m in catalogue(page):
            if not m.id or (only is not None and m.id not in only):
                continue
            found = (["fuzzy: the English changed"] if m.fuzzy else []) + problems(m.id, m.string, terms)
            for p in found:
                bad += 1
                print(f"{page}: {m.id[:70]!r}: {p}")
    print(f"{bad} problem(s) in {len(names)} page(s)")
    return 1 if bad else 0


# ------------------------------------------------------------------ the Sphinx extension
TABLE_CELL = re.compile(r"(<t[hd]>)([^<]*)(</t[hd]>)")
"""A cell of a table the code writes (``transformer_lab.page.table``: plain escaped text in ``<th>``/``<td>``)."""


def table_cells(markup: str) -> list[str]:
    """The words in the cells of the tables in an HTML output: each cell with three letters in a row, unescaped."""
    return [text for _, cell, _ in TABLE_CELL.findall(markup) if re.search(r"[A-Za-z]{3}", text := html.unescape(cell))]


def translate_table_cells(markup: str, translate) -> str:
    """``markup`` with each cell's words replaced by ``translate(text)``; a cell of words it leaves in English
    (names, the corpus's words) is marked ``lang="en"``."""
    def cell(m: re.Match) -> str:
        text = html.unescape(m[2])
        if not re.search(r"[A-Za-z]{3}", text):  # a number or a symbol (and "" would fetch a catalogue's header)
            return m[0]
        chinese = translate(text)
        if chinese == text:
            return f'{m[1]}<span lang="en">{m[2]}</span>{m[3]}'
        return m[1] + html.escape(chinese, quote=False) + m[3]

    return TABLE_CELL.sub(cell, markup)


def _html_outputs(document):
    """The HTML outputs of a page's code cells that hold a table (MyST-NB's mime bundles, before one is chosen)."""
    from docutils import nodes

    for bundle in document.findall(lambda n: isinstance(n, nodes.container) and n.get("mime_type") == "text/html"):
        for raw in bundle.findall(nodes.raw):
            if "<table" in raw.astext():
                yield raw


def _before_locale_transform():
    from docutils import nodes
    from sphinx.locale import init as init_locale
    from sphinx.transforms import SphinxTransform
    from sphinx.util.i18n import docname_to_domain
    from sphinx.util.nodes import extract_messages

    class BeforeLocale(SphinxTransform):
        """Before Sphinx translates a page (its ``Locale`` transform, priority 20), on the Chinese build:

        * each sentence that the page's code wrote with new numbers gets the translation :func:`renumbered`
          makes, so that a re-execution that measures another time leaves no English sentence on the page;
        * each display equation gets its translation written into the node, which is then marked done:
          ``Locale`` re-parses a translated literal node as the reST literal ``'::' + indent(msgstr)``, which
          MyST reads as a paragraph "::", so every equation with a translated ``\\text{}`` label would be lost;
        * a quotation given in its Chinese original and an English gloss (the seed's epigraphs) keeps only the
          original: translated back, the gloss would stand as a second, paraphrased Chinese version under it;
        * the words in the cells of the tables the code writes get their translation.

        On the gettext build, which writes the message templates, those table cells become messages of the page.
        """

        default_priority = 19

        def apply(self, **kwargs) -> None:
            if self.app.builder.name == "gettext":
                self.document.extend(_cells_as_messages(self.document))
                return
            if not self.config.language or self.config.language == "en":
                return
            dirs = [str(Path(self.env.srcdir) / d) for d in self.config.locale_dirs]
            domain = docname_to_domain(self.env.docname, self.config.gettext_compact)
            catalog, found = init_locale(dirs, self.config.language, domain)
            known = getattr(catalog, "_catalog", None)
            if not found or known is None:
                return
            index = by_skeleton(known)
            for _, msg in extract_messages(self.document):
                if msg not in known and (filled := renumbered(msg, index)) is not None:
                    known[msg] = filled
            for quote in list(self.document.findall(nodes.block_quote)):
                if quote.parent is None or not CJK.search(quote.astext()):
                    continue
                for p in [p for p in quote.children if isinstance(p, nodes.paragraph)]:
                    if not CJK.search(p.astext()):
                        quote.remove(p)  # the gloss in the same quotation
                gloss = quote.next_node(descend=False, siblings=True)
                if isinstance(gloss, nodes.block_quote) and not CJK.search(gloss.astext()):
                    gloss.parent.remove(gloss)  # the gloss as a quotation of its own, right after
            def translate(text: str) -> str:
                if (msgstr := catalog.gettext(text)) != text:
                    return msgstr
                return renumbered(text, index) or text

            for raw in _html_outputs(self.document):
                raw[:] = [nodes.Text(translate_table_cells(raw.astext(), translate))]
            for node in self.document.findall(nodes.math_block):
                msgstr = catalog.gettext(node.rawsource or node.astext())
                if msgstr != node.astext():
                    node[:] = [nodes.Text(msgstr)]
                    node.rawsource = msgstr
                node["translatable"] = False

    return BeforeLocale


def _cells_as_messages(document) -> list:
    """One paragraph per table cell of the page's outputs, for the gettext builder to collect as messages (a
    paragraph needs a source and a uid to be collected)."""
    import uuid

    from docutils import nodes

    out = []
    for raw in _html_outputs(document):
        for text in table_cells(raw.astext()):
            paragraph = nodes.paragraph(text, text)
            paragraph.source, paragraph.line, paragraph.uid = document["source"], raw.line or 0, uuid.uuid4().hex
            out.append(paragraph)
    return out


def setup(app) -> dict:
    """Sphinx extension (``_config.yml``'s local_extensions): sentences with new numbers keep their translation,
    and translated display equations stay equations."""
    app.add_transform(_before_locale_transform())
    return {"parallel_read_safe": True, "parallel_write_safe": True}


# ------------------------------------------------------------------ building
def extract() -> int:
    """Write the message templates ``_build/i18n/_build/gettext/<page>.pot`` (Sphinx's gettext builder, reading
    outputs from the execution cache: nothing is executed)."""
    proc = subprocess.run([str(BIN / "jupyter-book"), "build", str(ROOT), "--builder", "custom", "--custom-builder",
                           "gettext", "--path-output", str(POT_BUILD)], cwd=ROOT, capture_output=True, text=True)
    (POT_BUILD / "build.log").write_text(proc.stdout + proc.stderr)
    return proc.returncode


def update() -> int:
    """Bring every catalogue in line with the current sources: new messages added empty, changed ones fuzzy."""
    if extract():
        print(f"the gettext build failed: see {POT_BUILD / 'build.log'}", file=sys.stderr)
        return 1
    before = translations()
    status = subprocess.run([str(BIN / "sphinx-intl"), "update", "-p", str(TEMPLATES), "-l", LANGUAGE,
                             "-d", str(ROOT / "locales")], cwd=ROOT).returncode
    prefill(before)
    return status


@dataclass
class PageStats:
    page: str
    total: int
    translated: int
    fuzzy: list[str]
    missing: list[str]

    @property
    def share(self) -> float:
        return self.translated / self.total if self.total else 1.0


def stats(templates: Path = TEMPLATES, catalogues: Path = CATALOGUES) -> list[PageStats]:
    """For each page's template: how many of its messages the page's catalogue translates (not fuzzy, not empty;
    math and code need no entry, a sentence the code wrote with new numbers is translated by :func:`renumbered`),
    and which are fuzzy or missing."""
    out = []
    for page in pages(templates, ".pot"):
        wanted = [m.id for m in _read(templates / f"{page}.pot") if m.id]
        po = catalogues / f"{page}.po"
        done = {m.id: m for m in _read(po) if m.id} if po.exists() else {}
        translated = {i: m.string for i, m in done.items() if m.string and not m.fuzzy}
        fuzzy = [i for i in wanted if i in done and done[i].string and done[i].fuzzy]
        index = by_skeleton(translated)
        missing = [i for i in wanted if i not in fuzzy and i not in translated and not nothing_to_translate(i)
                   and renumbered(i, index) is None]
        out.append(PageStats(page, len(wanted), len(wanted) - len(fuzzy) - len(missing), fuzzy, missing))
    return out


CELL_SPLIT = re.compile(r"(?<!\\)\|")
TABLE_RULE = re.compile(r"\|?[\s:|-]+\|?")
LIST_ITEM = re.compile(r"(?:[-*+]|\d+[.)])\s+")


def output_messages(markdown: str) -> list[str]:
    """The messages of Markdown that a cell displays, as Sphinx cuts them: each paragraph, list item, heading and
    table cell, with its white space folded to single spaces."""
    out: list[str] = []
    for block in re.split(r"\n\s*\n", markdown.strip()):
        lines = [line.strip() for line in block.strip().splitlines() if line.strip()]
        if lines and all(line.startswith("|") for line in lines):  # a table: one message per cell
            out += [cell.strip() for line in lines if not TABLE_RULE.fullmatch(line)
                    for cell in CELL_SPLIT.split(line.strip("|"))]
        elif lines and all(LIST_ITEM.match(line) for line in lines):  # a list of one-line items
            out += [LIST_ITEM.sub("", line, count=1) for line in lines]
        elif lines and lines[0].startswith("#"):
            out += [lines[0].lstrip("#").strip(), *([" ".join(lines[1:])] if lines[1:] else [])]
        else:
            out.append(" ".join(lines))
    return [m for m in (" ".join(m.split()) for m in out) if m]


def untranslated(page: str, markdowns: list[str], catalogues: Path = CATALOGUES) -> list[str]:
    """The messages of ``markdowns`` (what a page's cells displayed, :func:`output_messages`) that the page's
    catalogue does not translate, directly or with new numbers (:func:`renumbered`): what another machine's
    execution would leave in English on the Chinese page."""
    done = {" ".join(m.id.split()): m.string for m in _read(catalogues / f"{page}.po")
            if m.id and m.string and not m.fuzzy}
    index = by_skeleton(done)
    return [m for text in markdowns for m in output_messages(text)
            if m not in done and not nothing_to_translate(m) and renumbered(m, index) is None]


def print_stats() -> int:
    rows = stats()
    if not rows:
        print(f"no message templates in {TEMPLATES}: run `make book` first", file=sys.stderr)
        return 1
    for s in rows:
        print(f"{s.page:36s} {s.translated:4d} / {s.total:4d} translated ({s.share:6.1%}), "
              f"{len(s.fuzzy)} fuzzy, {len(s.missing)} missing")
    total, done = sum(s.total for s in rows), sum(s.translated for s in rows)
    print(f"{'all pages':36s} {done:4d} / {total:4d} translated ({done / total:6.1%})")
    return 0


CHROME = {"author": "Transformer Math Lab 团队", "search": "搜索本书……", "show": "点击显示", "hide": "点击隐藏",
          "show code": "显示代码单元", "hide code": "隐藏代码单元"}
"""The site's own words that no page's catalogue holds (the theme's search field, the toggle buttons' hints, the
author line), in Chinese."""


def config(source: Path = ROOT / "_config.yml") -> dict:
    """The English configuration with the Chinese language, title and search dictionary, and the main execution
    cache (so no page runs again)."""
    c = yaml.safe_load(source.read_text())
    c["title"] = translated("book/intro").get(c["title"], c["title"])
    c["author"] = CHROME["author"]
    sphinx = c["sphinx"]["config"]
    sphinx.update(language=LANGUAGE, html_search_options={"dict": str(SEARCH_WORDS)},
                  togglebutton_hint=CHROME["show"], togglebutton_hint_hide=CHROME["hide"],
                  nb_code_prompt_show=CHROME["show code"], nb_code_prompt_hide=CHROME["hide code"])
    sphinx["html_theme_options"] = {**sphinx.get("html_theme_options", {}), "search_bar_text": CHROME["search"]}
    c["execute"]["cache"] = str(ROOT / c["execute"]["cache"])
    c["sphinx"]["local_extensions"] = {k: str(ROOT / v) for k, v in c["sphinx"]["local_extensions"].items()}
    return c


def toc() -> Path:
    """``_toc.yml`` with its part captions in Chinese, as book/intro's catalogue translates them (sphinx-external-toc
    adds the captions after Sphinx has translated the page, so the catalogue alone leaves them English)."""
    contents = yaml.safe_load((ROOT / "_toc.yml").read_text())
    chinese = translated("book/intro")
    for part in contents.get("parts", []):
        part["caption"] = chinese.get(part.get("caption"), part.get("caption"))
    path = OUT / "_toc.yml"
    path.write_text(yaml.safe_dump(contents, allow_unicode=True, sort_keys=False))
    return path


def build(jb_args: list[str], run) -> int:
    """Build the Chinese site with ``run(root, args, html_dir)`` (``tools/build.py``'s runner) into
    ``_build/zh`` and copy it to ``_build/html/zh``; also refresh the message templates the translation tests read."""
    OUT.mkdir(parents=True, exist_ok=True)
    SEARCH_WORDS.write_text("".join(f"{zh} 1000 n\n" for _, zh, _ in glossary() if " " not in zh))
    (OUT / "_config.yml").write_text(yaml.safe_dump(config(), allow_unicode=True, sort_keys=False))
    status = run(ROOT, [*jb_args, "--config", str(OUT / "_config.yml"), "--toc", str(toc()), "--path-output", str(OUT)],
                 OUT / "_build" / "html")
    if status == 0:
        shutil.rmtree(SITE, ignore_errors=True)
        shutil.copytree(OUT / "_build" / "html", SITE)
    if extract():
        print(f"the gettext build (message templates for tests/test_translation.py) failed: see "
              f"{POT_BUILD / 'build.log'}", file=sys.stderr)
        return status or 1
    return status


def main(args: list[str]) -> int:
    usage = __doc__.split("\n\n")[0]
    match args:
        case ["update"]:
            return update()
        case ["stats"]:
            return print_stats()
        case ["todo", page]:
            return todo(page)
        case ["pairs", page]:
            return pairs(page)
        case ["fill", page, path]:
            return fill(page, path)
        case ["check", *names]:
            return check(names)
    print(usage, file=sys.stderr)
    return 2


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
