"""The Chinese edition's catalogues kept in step with the English sources (tools/i18n.py).

`make book` writes one message template per page from the current sources (_build/i18n/_build/gettext); each page's
catalogue (locales/zh_CN/LC_MESSAGES/<page>.po) must translate every message of it, none fuzzy: an English edit
that is not carried into Chinese fails here, naming the page and the message (run `python tools/i18n.py update`,
then translate what `python tools/i18n.py todo PAGE` lists). Every translation keeps the English's math, code,
cross-reference targets, links and numbers, and renders the glossary's enforced terms as the glossary says.
"""

import re

import i18n
import pytest
from conftest import ROOT

pytestmark = pytest.mark.skipif(not i18n.TEMPLATES.is_dir(), reason="run `make book` first (message templates)")

STATS = i18n.stats() if i18n.TEMPLATES.is_dir() else []
TERMS = i18n.glossary()


@pytest.mark.parametrize("page", STATS, ids=lambda s: s.page)
def test_every_message_of_the_page_is_translated(page):
    print(f"{page.page}: {page.translated} / {page.total} translated ({page.share:.1%})")
    assert not page.missing, (f"{page.page}: {len(page.missing)} message(s) not translated, e.g. "
                              f"{page.missing[0][:100]!r} (python tools/i18n.py todo {page.page})")
    assert not page.fuzzy, (f"{page.page}: {len(page.fuzzy)} message(s) whose English changed since they were "
                            f"translated, e.g. {page.fuzzy[0][:100]!r} (python tools/i18n.py todo {page.page})")


def test_every_catalogue_belongs_to_a_page():
    pages = {s.page for s in STATS}
    orphans = [p for p in i18n.pages() if p not in pages]
    assert pages and not orphans, f"catalogues of pages that no longer exist: {orphans}"


@pytest.mark.parametrize("page", STATS, ids=lambda s: s.page)
def test_translations_keep_math_code_targets_numbers_and_terms(page):
    wrong = [f"{m.id[:70]!r}: {p}" for m in i18n.catalogue(page.page) if m.id and m.string and not m.fuzzy
             for p in i18n.problems(m.id, m.string, TERMS)]
    assert not wrong, f"{page.page}: {len(wrong)} problem(s):\n" + "\n".join(wrong[:10])


@pytest.mark.parametrize("page", STATS, ids=lambda s: s.page)
def test_the_chinese_page_shows_the_translation(page):
    """The Chinese site was built from these catalogues: its page's title is the translated title."""
    site = ROOT / "_build" / "html" / "zh" / f"{page.page}.html"
    if not site.is_file():
        pytest.skip("the Chinese site is not built")
    english = (ROOT / "_build" / "html" / f"{page.page}.html").read_text(encoding="utf8")
    heading = re.sub(r"<[^>]+>|#", "", re.search(r"<h1[^>]*>(.*?)</h1>", english, re.S).group(1)).strip()
    heading = heading.replace("\u2019", "'").replace("\u201c", "\"").replace("\u201d", "\"")
    title = next(m for m in i18n.catalogue(page.page) if m.id and re.sub(r"[*`]", "", m.id) == heading)
    html = site.read_text(encoding="utf8")
    assert f"<h1>{re.sub(r'[*`]', '', title.string)}" in re.sub(r"<h1[^>]*>", "<h1>", html), title.string


# What the checker rejects: a typical slip of each kind. And what it accepts: the freedom a translation has.
ENGLISH = ("The loss of the {ref}`trained model <ch8-train>` is $1.98$ nats per token after 2,000 steps of "
           "`train`, see [the log](https://example.org/log).")
RIGHT = "训练 2000 步 `train` 之后，{ref}`训练好的模型 <ch8-train>` 的损失是每个词元 $1.98$ 奈特，见[日志](https://example.org/log)。"
WRONG = {
    "math changed": RIGHT.replace("$1.98$", "$1.98 $"),
    "target changed": RIGHT.replace("<ch8-train>", "<ch8-training>"),
    "role lost": RIGHT.replace("{ref}`训练好的模型 <ch8-train>`", "训练好的模型"),
    "code lost": RIGHT.replace("`train`", "train"),
    "number lost": RIGHT.replace("2000", "两千"),
    "link changed": RIGHT.replace("example.org/log", "example.org/logs"),
    "term not as in the glossary": RIGHT.replace("词元", "标记"),
    "untranslated": "",
    "English copied": ENGLISH,
    "ASCII quotation marks": RIGHT.replace("的损失", "的\"损失\""),
}


def test_checker_accepts_a_faithful_translation_with_its_freedoms():
    assert i18n.problems(ENGLISH, RIGHT, TERMS) == []
    assert i18n.problems(ENGLISH, RIGHT.replace("2000", "2,000"), TERMS) == []  # a thousands separator or not
    assert i18n.problems("$$x = 1$$", "$$x = 1$$", TERMS) == []  # math alone is copied
    assert i18n.problems("pre-LN LayerNorm", "pre-LN LayerNorm", TERMS) == []  # so is a name
    assert i18n.problems("（原文）Transformer 是一种神经网络", "（原文）Transformer 是一种神经网络", TERMS) == []


@pytest.mark.parametrize("slip", WRONG)
def test_checker_rejects_a_typical_slip(slip):
    assert i18n.problems(ENGLISH, WRONG[slip], TERMS), f"the checker let through: {slip}"


def test_table_cells_the_code_writes_are_messages_and_get_their_translation():
    """The words of a table's cells are its messages (numbers alone are not); the Chinese page replaces each cell
    by its translation, escaped again, and marks a cell left in English lang="en"."""
    table = ("<table><thead><tr><th>word</th><th>max |diff| &lt; 1</th></tr></thead>"
             "<tbody><tr><td>king</td><td>1.2e-16</td></tr></tbody></table>")
    assert i18n.table_cells(table) == ["word", "max |diff| < 1", "king"]
    chinese = {"word": "词", "max |diff| < 1": "最大 |差| < 1"}
    assert i18n.translate_table_cells(table, lambda t: chinese.get(t, t)) == (
        "<table><thead><tr><th>词</th><th>最大 |差| &lt; 1</th></tr></thead>"
        '<tbody><tr><td><span lang="en">king</span></td><td>1.2e-16</td></tr></tbody></table>')


def test_one_idea_keeps_one_name():
    """A rendering the glossary lists as another name of a term is refused: the drift 检查程序/检查器."""
    assert i18n.variants()["检查程序"] == "检查器"
    english = "The checker rejects a typical slip."
    assert not i18n.problems(english, "检查器会拒绝典型的错误。", TERMS)
    assert any("检查器" in p for p in i18n.problems(english, "检查程序会拒绝典型的错误。", TERMS))


@pytest.mark.parametrize(("quote", "echoes"), [
    ("原文说 Transformer 是“一个神经概率语言模型”。", True),  # the English gloss translated back
    ("原文说“损失是信息的损失”。", True),  # the seed: 损失函数的本质是信息量损失
    ("原文说“残差缓解梯度消失”。", True),  # a word dropped: 残差连接（Residual）缓解梯度消失
    ("原文说 Transformer 是一种“神经概率语言模型”。", False),
    ("原文说“残差连接（Residual）缓解梯度消失”。", False),  # the seed's own words, its English word included
    ("头并没有被“排列组合”。", False),  # a phrase of the seed
    ("路径长度是“前向和反向信号在网络中必须经过的路径的长度”。", False),  # another source's words
])
def test_the_seed_is_quoted_in_its_own_words(quote, echoes):
    assert bool(i18n.seed_misquotes(quote)) == echoes, i18n.seed_misquotes(quote)


def test_a_sentence_the_code_wrote_with_new_numbers_keeps_its_translation():
    """A re-execution measures another time: the sentence keeps its translation with the new numbers in place, in
    whatever order the Chinese puts them; other words get none, and so does one old number becoming two new ones
    when the Chinese reorders them (two equal numbers kept in the English's order each take their new number)."""
    known = i18n.by_skeleton({"Here: `exp` 164 µs, `exp2` 59 µs per call, a ratio of 2.8.":
                              "比值为 2.8：`exp2` 每次 59 µs，`exp` 164 µs。"})
    assert (i18n.renumbered("Here: `exp` 150 µs, `exp2` 60 µs per call, a ratio of 2.5.", known)
            == "比值为 2.5：`exp2` 每次 60 µs，`exp` 150 µs。")
    assert i18n.renumbered("There: `exp` 150 µs, `exp2` 60 µs per call, a ratio of 2.5.", known) is None
    comma = i18n.by_skeleton({"The uncached one 40,550, an average of 135.": "不带缓存的 40,550 个，平均 135。"})
    assert i18n.renumbered("The uncached one 41,000, an average of 136.", comma) == "不带缓存的 41,000 个，平均 136。"
    reordered = i18n.by_skeleton({"From 2 to 2 steps, then 5.": "先是 5，然后从 2 步到 2 步。"})
    assert i18n.renumbered("From 2 to 3 steps, then 5.", reordered) is None
    in_order = i18n.by_skeleton({"largest |difference| vs lens.read: 1.9e-06, last layer: 1.9e-06":
                                 "与 lens.read 的最大 |差|：1.9e-06，最后一层：1.9e-06"})
    assert (i18n.renumbered("largest |difference| vs lens.read: 1.4e-06, last layer: 9.5e-07", in_order)
            == "与 lens.read 的最大 |差|：1.4e-06，最后一层：9.5e-07")


@pytest.mark.parametrize(("here", "there"), [
    ("1.4e-06", "9.5e-07"), ("0", "1.4e-06"), ("0.6", "1.2"), ("-0.0", "2.5e+03"), ("1e-05", "3.25E-7"),
    ("\u22121.5", "0.25"), ("12", "12,345.5")])
def test_another_machines_round_off_in_any_number_form_keeps_the_translation(here, there):
    """Another CPU's round-off prints another number, often in another form (an exact 0 here, 1.4e-06 there; a
    sign; an exponent): the sentence still finds its translation, with the other machine's numbers in place."""
    english = "largest |difference| vs `lens.read`: {}, about {}× the float32 unit round-off."
    chinese = "与 `lens.read` 的最大差：{}，约为 float32 单位舍入误差的 {} 倍。"
    known = i18n.by_skeleton({english.format(here, "3"): chinese.format(here, "3")})
    assert i18n.renumbered(english.format(there, "7"), known) == chinese.format(there, "7")
