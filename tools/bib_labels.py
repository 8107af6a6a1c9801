"""Sphinx extension: bibliography labels in the form of the in-text citations, "Levy and Goldberg, 2014".

The book cites author-year, but the default bibliography style labels its entries alphabetically ("[LG14]"), so a
reader could not match a citation to its entry. This registers the pybtex style ``authoryear`` (alpha's formatting
and sorting, author-year labels; two entries with the same authors and year become "2016a" and "2016b") and the
citation style ``author_year_label`` (sphinxcontrib-bibtex's author_year, with the year, suffix included, read from
the label), selected in _config.yml by ``bibtex_default_style`` and ``bibtex_reference_style``.
"""

from collections import Counter
from dataclasses import dataclass

from pybtex.plugin import register_plugin
from pybtex.richtext import Text
from pybtex.style.formatting.alpha import Style as AlphaStyle
from pybtex.style.labels import BaseLabelStyle
from sphinx.application import Sphinx
from sphinxcontrib.bibtex.plugin import register_plugin as register_bibtex_plugin
from sphinxcontrib.bibtex.style.referencing import GroupReferenceStyle
from sphinxcontrib.bibtex.style.referencing.author_year import AuthorYearReferenceStyle
from sphinxcontrib.bibtex.style.referencing.basic_author_year import (
    BasicAuthorYearParentheticalReferenceStyle,
    BasicAuthorYearTextualReferenceStyle,
)
from sphinxcontrib.bibtex.style.template import join, join2, node, post_text, pre_text, reference


def _last_name(person) -> str:
    return " ".join(Text.from_latex(part).render_as("text") for part in person.prelast_names + person.last_names)


def author_year(entry) -> str:
    """"A, 2014", "A and B, 2014" or "A et al., 2014" (authors, else editors), as sphinxcontrib-bibtex cites."""
    names = [_last_name(p) for p in entry.persons.get("author") or entry.persons.get("editor") or []]
    who = (names[0] if len(names) == 1 else " and ".join(names) if len(names) == 2
           else f"{names[0]} et al." if names else entry.key)
    return f"{who}, {entry.fields.get('year', 'n.d.')}"


class AuthorYearLabelStyle(BaseLabelStyle):
    def format_labels(self, sorted_entries):
        sorted_entries = list(sorted_entries)
        labels = [author_year(e) for e in sorted_entries]
        shared, seen = Counter(labels), Counter()
        for label in labels:
            seen[label] += 1
            yield label + (chr(ord("a") + seen[label] - 1) if shared[label] > 1 else "")


class AuthorYearStyle(AlphaStyle):
    default_label_style = "authoryear"


@node
def label_year(children, data) -> Text:
    """The year in the entry's label (with its "a"/"b" when two entries share authors and year)."""
    assert not children
    return Text(data["formatted_entry"].label.rsplit(", ", 1)[-1])


@dataclass
class _Parenthetical(BasicAuthorYearParentheticalReferenceStyle):
    def inner(self, role_name: str):
        return join2(sep1=self.pre_text_sep, sep2=self.post_text_sep)[
            pre_text,
            reference[join(sep=self.author_year_sep)[
                self.person.author_or_editor_or_title(full="s" in role_name), label_year]],
            post_text]


@dataclass
class _Textual(BasicAuthorYearTextualReferenceStyle):
    def inner(self, role_name: str):
        return join(sep=self.text_reference_sep)[
            self.person.author_or_editor_or_title(full="s" in role_name),
            join[self.bracket.left,
                 join2(sep1=self.pre_text_sep, sep2=self.post_text_sep)[pre_text, reference[label_year], post_text],
                 self.bracket.right]]


@dataclass
class AuthorYearLabelReferenceStyle(AuthorYearReferenceStyle):
    def __post_init__(self):
        super().__post_init__()
        self.styles[0] = _Parenthetical(bracket=self.bracket_parenthetical, person=self.person,
                                        author_year_sep=self.author_year_sep, pre_text_sep=self.pre_text_sep,
                                        post_text_sep=self.post_text_sep)
        self.styles[1] = _Textual(bracket=self.bracket_textual, person=self.person,
                                  text_reference_sep=self.text_reference_sep, pre_text_sep=self.pre_text_sep,
                                  post_text_sep=self.post_text_sep)
        GroupReferenceStyle.__post_init__(self)  # map the roles to the two styles above


def setup(app: Sphinx) -> dict:
    register_plugin("pybtex.style.labels", "authoryear", AuthorYearLabelStyle)
    register_plugin("pybtex.style.formatting", "authoryear", AuthorYearStyle)
    register_bibtex_plugin("sphinxcontrib.bibtex.style.referencing", "author_year_label",
                           AuthorYearLabelReferenceStyle)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
