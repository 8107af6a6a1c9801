"""Display helpers the chapter pages share: sources, equations, tables.

Every page imports these instead of defining its own copy:

* :func:`show_source` prints the source of a package object, exactly as it is in ``transformer_lab``;
* :func:`show_equations` typesets ``lhs = expression`` lines from SymPy expressions;
* :func:`show_steps` typesets a derivation, one ``label: expression`` line per step;
* :func:`table` displays a table, from rows of cells or from a dict ``{name: value}`` (a check's result);
* :func:`claim` guards a sentence of the prose: the page's build fails, quoting the sentence, when the
  computation it describes stops bearing it out;
* :func:`bilingual` is the site's own words in an output (a figure's note, an exercise's note) in English and
  Chinese, so that one execution serves both editions of the website;
* :func:`seed` is every seed a page uses, shifted by ``TL_SEED_OFFSET`` from the environment, so that a second
  execution with another offset checks that each guarded sentence holds for other seeds too.

IPython is imported only when something is displayed: the package does not depend on it, the pages (which run in
a Jupyter kernel) do.
"""

from __future__ import annotations

import html
import inspect
import numbers
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import sympy as sp

__all__ = ["ClaimFailed", "claim", "markdown_table", "seed", "show_equations", "show_source", "show_steps", "table"]

SEED_OFFSET = "TL_SEED_OFFSET"  # the environment variable that shifts every seed of a page

Rows = Mapping[str, Any] | Iterable[Sequence[Any]]


def seed(n: int) -> int:
    """The seed ``n`` a page asks for, plus the integer in ``$TL_SEED_OFFSET`` (0 when unset).

    Pages write ``torch.manual_seed(seed(0))`` rather than ``torch.manual_seed(0)``: the book is built with offset
    0, and the tests execute every page again with another offset, so a sentence that held for one seed only fails
    there instead of on a reader's machine.
    """
    raw = os.environ.get(SEED_OFFSET, "0").strip() or "0"
    try:
        offset = int(raw)
    except ValueError:
        raise ValueError(f"{SEED_OFFSET} must be a whole number, got {raw!r}") from None
    if not isinstance(n, numbers.Integral) or isinstance(n, bool) or n < 0:
        raise ValueError(f"seed takes a non-negative whole number, got {n!r}")
    return int(n) + offset


class ClaimFailed(AssertionError):
    """A sentence of a page that its own computation no longer bears out."""


def claim(condition: Any, sentence: str, *, evidence: Any = None) -> None:
    """Guard one sentence of the prose by the computation it describes.

    Put the call in a ``remove-cell`` right after the computation, with the sentence as it is written on the page
    (or its exact content): ``claim(ratio > 100, "the plain stack loses the gradient at the default gain",
    evidence=ratio)``. When ``condition`` is false (a default, a seed or a component changed), this raises
    :class:`ClaimFailed` quoting the sentence and the evidence, so the book's build fails at the sentence it
    falsified. ``tools/build.py`` counts these guards per page.
    """
    if not isinstance(sentence, str) or not sentence.strip():
        raise ValueError("claim needs the sentence it guards, as a non-empty string")
    try:
        holds = bool(condition)
    except Exception as exc:  # e.g. the truth value of a tensor with several elements
        raise TypeError(f"claim: the condition for {sentence!r} must be a single truth value, "
                        f"got {type(condition).__name__} ({exc})") from exc
    if not holds:
        shown = "" if evidence is None else f" (evidence: {evidence})"
        raise ClaimFailed(f"the page says “{sentence}”, but its computation no longer shows it{shown}")


def show_source(obj: Any) -> None:
    """Print the source of a package object (function, class or method), exactly as it is in transformer_lab."""
    print(inspect.getsource(obj))


def _display_math(latex: str) -> None:
    from IPython.display import Math, display

    display(Math(latex))


def show_equations(*pairs: tuple[str, Any]) -> None:
    """Display one typeset equation ``lhs = expr`` per ``(lhs, expr)`` pair: ``lhs`` is LaTeX, ``expr`` a SymPy
    expression (or anything ``sympy.latex`` prints)."""
    for lhs, expr in pairs:
        _display_math(f"{lhs} = {sp.latex(expr)}")


# x_i, x^n or x_{ij} in a step's label: typeset as math, the rest of the label stays text
_SUB_SUP = re.compile(r"([_^])(\{[^}]*\}|[A-Za-z0-9]+)")


def show_steps(steps: Iterable[tuple[str, Any]]) -> None:
    """Display a derivation: one typeset line ``label: expr`` per ``(label, SymPy expression)`` step. The label is
    text, except that subscripts and superscripts in it (``x_i``, ``x^n``, ``x_{ij}``) become math."""
    for label, expr in steps:
        text = _SUB_SUP.sub(lambda m: "}" + m[1] + "{" + m[2].strip("{}") + r"}\text{", label)
        _display_math(r"\text{" + text + r"}: \quad " + sp.latex(expr))


def _format_value(value: Any) -> str:
    """A dict value as the pages show it: real non-integer numbers as ``1.23e-16``, anything else (an int, a bool
    such as gradcheck's ``True``) as ``str``."""
    if isinstance(value, numbers.Real) and not isinstance(value, numbers.Integral):
        return f"{value:.2e}"
    return str(value)


def _cells(rows: Rows, header: Sequence[str]) -> list[list[str]]:
    """The body of a table as strings: a dict gives ``(name, formatted value)`` rows, a row of cells gives
    ``str`` of each cell (numbers in rows are shown as given: format them first)."""
    if isinstance(rows, Mapping):
        body = [[str(name), _format_value(value)] for name, value in rows.items()]
    else:
        body = [[str(cell) for cell in row] for row in rows]
    for row in body:
        if len(row) != len(header):
            raise ValueError(f"table: a row has {len(row)} cells, the header {len(header)}: {row}")
    return body


def _markdown(body: list[list[str]], header: Sequence[str]) -> str:
    def line(cells: Iterable[Any]) -> str:
        return "| " + " | ".join(str(c).replace("|", r"\|") for c in cells) + " |"

    return "\n".join([line(header), "|" + "---|" * len(header), *(line(row) for row in body)])


def _html(body: list[list[str]], header: Sequence[str]) -> str:
    def line(tag: str, cells: Iterable[Any]) -> str:
        return "<tr>" + "".join(f"<{tag}>{html.escape(str(c))}</{tag}>" for c in cells) + "</tr>"

    rows = "".join(line("td", row) for row in body)
    return f'<table class="table"><thead>{line("th", header)}</thead><tbody>{rows}</tbody></table>'


def markdown_table(rows: Rows, header: Sequence[str] = ("quantity", "value")) -> str:
    """The table :func:`table` displays, as Markdown text (a ``|`` inside a cell escaped as ``\\|``)."""
    return _markdown(_cells(rows, header), header)


def table(rows: Rows, header: Sequence[str] = ("quantity", "value")) -> None:
    """Display a table with columns ``header``, from rows of cells or from a dict ``{name: value}`` (two columns,
    float values as ``1.23e-16``). The book renders it as HTML; a plain-text reader gets the Markdown text."""
    from IPython.display import display

    body = _cells(rows, header)
    display({"text/html": _html(body, header), "text/plain": _markdown(body, header)}, raw=True)


def bilingual(english: str, chinese: str) -> str:
    """HTML (escaped already) that shows ``english``, or ``chinese`` on a page whose language is Chinese (the
    book's CSS, ``book/_static/book.css``). Jupyter, without that CSS, shows the English."""
    return (f'<span class="tl-bilingual" lang="en">{english}</span>'
            f'<span class="tl-bilingual" lang="zh" style="display: none">{chinese}</span>')
