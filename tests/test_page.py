"""The display helpers the chapter pages share (transformer_lab.page)."""

import inspect

import pytest
import sympy as sp
import torch

from transformer_lab import page
from transformer_lab.norm import layer_norm


@pytest.fixture
def shown(monkeypatch):
    """What the helpers display, in order: (object, keyword arguments) per call of IPython's ``display``."""
    calls = []
    monkeypatch.setattr("IPython.display.display", lambda obj, **kwargs: calls.append((obj, kwargs)))
    return calls


def test_dict_gives_two_columns_with_floats_in_scientific_notation():
    rows = {"attention: ours vs torch": 2.220446049250313e-16, "gradcheck passed": True, "steps": 120}
    assert page.markdown_table(rows, ("comparison", "largest difference")) == (
        "| comparison | largest difference |\n"
        "|---|---|\n"
        "| attention: ours vs torch | 2.22e-16 |\n"
        "| gradcheck passed | True |\n"
        "| steps | 120 |")


def test_rows_are_shown_as_given_and_pipes_are_escaped():
    rows = [("king", "richard, edward"), ("output", f"{1.5e-16:.1e}"), (3, 0.25)]
    assert page.markdown_table(rows, ("word", "max |diff|")) == (
        "| word | max \\|diff\\| |\n"
        "|---|---|\n"
        "| king | richard, edward |\n"
        "| output | 1.5e-16 |\n"
        "| 3 | 0.25 |")


def test_a_row_of_the_wrong_length_is_refused():
    with pytest.raises(ValueError, match="3 cells, the header 2"):
        page.markdown_table([("a", "b", "c")], ("x", "y"))
    with pytest.raises(ValueError, match="the header 1"):  # the arguments swapped: the header read as rows
        page.markdown_table(["format", "bits"], [["float16", 16]])


def test_table_displays_escaped_html_and_the_markdown_as_plain_text(shown):
    rows = [("x < y & z", "1.0e-16")]
    page.table(rows, ("comparison", "max |difference|"))
    (bundle, kwargs), = shown
    assert kwargs == {"raw": True}
    assert bundle["text/html"] == (
        '<table class="table"><thead><tr><th>comparison</th><th>max |difference|</th></tr></thead>'
        "<tbody><tr><td>x &lt; y &amp; z</td><td>1.0e-16</td></tr></tbody></table>")
    assert bundle["text/plain"] == page.markdown_table(rows, ("comparison", "max |difference|"))


def test_table_reads_a_generator_of_rows_once(shown):
    page.table(((name, n) for name, n in [("a", 1), ("b", 2)]), ("name", "n"))
    (bundle, _), = shown
    assert "<td>b</td><td>2</td>" in bundle["text/html"]
    assert bundle["text/plain"].endswith("| b | 2 |")


def test_show_source_prints_the_source_of_a_function(capsys):
    page.show_source(layer_norm)
    out = capsys.readouterr().out
    assert out == inspect.getsource(layer_norm) + "\n"
    assert out.startswith("def layer_norm(")


def test_show_equations_typesets_one_equation_per_pair(shown):
    x = sp.Symbol("x")
    page.show_equations(("f(x)", x**2), (r"\operatorname{d}f/\operatorname{d}x", sp.diff(x**2, x)))
    assert [obj.data for obj, _ in shown] == ["f(x) = x^{2}", r"\operatorname{d}f/\operatorname{d}x = 2 x"]


def test_show_steps_keeps_labels_as_text_with_sub_and_superscripts_as_math(shown):
    page.show_steps([("mean of x_i", sp.Integer(0)), ("sum of x^2", sp.Integer(1))])
    assert [obj.data for obj, _ in shown] == [r"\text{mean of x}_{i}\text{}: \quad 0",
                                               r"\text{sum of x}^{2}\text{}: \quad 1"]


def test_claim_passes_silently_and_fails_quoting_the_sentence_and_evidence():
    page.claim(True, "one is one")
    page.claim(torch.tensor(True), "a one-element tensor is a truth value")
    with pytest.raises(page.ClaimFailed, match=r"“momentum damps the zig-zag”.*evidence: 3\.5"):
        page.claim(1 > 2, "momentum damps the zig-zag", evidence=3.5)


def test_claim_refuses_an_empty_sentence_and_an_ambiguous_condition():
    with pytest.raises(ValueError, match="sentence"):
        page.claim(True, "  ")
    with pytest.raises(TypeError, match="single truth value"):
        page.claim(torch.tensor([True, False]), "several values are no claim")


def test_seed_adds_the_environments_offset(monkeypatch):
    monkeypatch.delenv("TL_SEED_OFFSET", raising=False)
    assert page.seed(0) == 0 and page.seed(7) == 7
    monkeypatch.setenv("TL_SEED_OFFSET", "3")
    assert page.seed(0) == 3 and page.seed(7) == 10
    monkeypatch.setenv("TL_SEED_OFFSET", " ")
    assert page.seed(5) == 5


@pytest.mark.parametrize("bad", ["one", "1.5"])
def test_seed_refuses_an_offset_that_is_not_a_whole_number(monkeypatch, bad):
    monkeypatch.setenv("TL_SEED_OFFSET", bad)
    with pytest.raises(ValueError, match="TL_SEED_OFFSET must be a whole number"):
        page.seed(0)


@pytest.mark.parametrize("bad", [-1, 1.0, True, "0"])
def test_seed_refuses_what_is_not_a_seed(bad):
    with pytest.raises(ValueError, match="non-negative whole number"):
        page.seed(bad)
