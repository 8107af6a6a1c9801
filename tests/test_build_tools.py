"""The build's own promises, on a tiny book in a temporary folder (a few seconds per build):

* a change to any file of transformer_lab/ re-executes the notebooks (MyST-NB issue #299), and a rebuild with
  nothing changed re-executes none (tools/lab_cache.py);
* a page whose code raises fails the build with a report naming the page and the cell (tools/build.py), and
  the next build executes it again instead of publishing its half-executed run (tools/lab_cache.py).
"""


import build
import pytest
from conftest import NOTEBOOK_HEADER as HEADER
from conftest import ROOT
from lab_cache import package_hash


def make_book(tmp_path, page_code: str, repository: str = ""):
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / "_config.yml").write_text(
        "title: tiny\nonly_build_toc_files: true\nexecute:\n  execute_notebooks: cache\n"
        f"launch_buttons:\n  binderhub_url: https://mybinder.org\nrepository:\n  url: '{repository}'\n"
        f"sphinx:\n  local_extensions:\n    lab_cache: {ROOT / 'tools'}\n    launch_buttons: {ROOT / 'tools'}\n")
    (tmp_path / "_toc.yml").write_text("format: jb-book\nroot: index\nchapters:\n  - file: page\n")
    (tmp_path / "index.md").write_text("# Tiny\n")
    (tmp_path / "page.md").write_text(HEADER + "# A page\n\n```{code-cell} ipython3\n" + page_code + "\n```\n")
    (tmp_path / "transformer_lab").mkdir()
    (tmp_path / "transformer_lab" / "mod.py").write_text("VALUE = 1\n")
    return tmp_path


def built(root, capsys) -> str:
    assert build.run(root, [], root / "_build" / "html") == 0, capsys.readouterr().out
    return capsys.readouterr().out


def test_package_hash_sees_every_file(tmp_path):
    book = make_book(tmp_path, "print(1)")
    h0 = package_hash(book)
    (book / "transformer_lab" / "mod.py").write_text("VALUE = 2\n")
    h1 = package_hash(book)
    (book / "transformer_lab" / "new.txt").write_text("data")
    assert len({h0, h1, package_hash(book)}) == 3


@pytest.mark.timeout(300)
def test_package_change_re_executes_and_nothing_changed_re_executes_none(tmp_path, capsys):
    book = make_book(tmp_path, "print('hello')")
    assert "1 notebook(s) executed" in built(book, capsys)
    assert "0 notebook(s) executed" in built(book, capsys)
    (book / "transformer_lab" / "mod.py").write_text("VALUE = 2  # a one-line edit\n")
    assert "1 notebook(s) executed" in built(book, capsys)
    assert "0 notebook(s) executed" in built(book, capsys)


@pytest.mark.timeout(300)
def test_a_package_change_reaches_every_build_that_shares_the_cache(tmp_path, capsys):
    """The English site, the Chinese one and the gettext templates share one execution cache. After a package
    change the first build executes the page; a second build with its own output must still read the page again
    (from the cache), not keep what it read before the change."""
    book = make_book(tmp_path, "from transformer_lab.mod import VALUE\nprint('value', VALUE)")
    config = book / "_config.yml"
    config.write_text(config.read_text().replace("execute_notebooks: cache\n", "execute_notebooks: cache\n"
                                                 f"  cache: {book / '_build' / '.jupyter_cache'}\n"))
    other = ["--path-output", str(book / "_build" / "other")]
    built(book, capsys)
    assert build.run(book, other, book / "_build" / "other" / "_build" / "html") == 0
    capsys.readouterr()
    (book / "transformer_lab" / "mod.py").write_text("VALUE = 2\n")
    assert "1 notebook(s) executed" in built(book, capsys)
    assert build.run(book, other, book / "_build" / "other" / "_build" / "html") == 0
    assert "1 from cache" in capsys.readouterr().out
    assert "value 2" in (book / "_build" / "other" / "_build" / "html" / "page.html").read_text()


@pytest.mark.timeout(300)
def test_a_raising_page_names_page_and_cell(tmp_path, capsys):
    book = make_book(tmp_path, "x = 1\nraise RuntimeError('the chapter is broken')")
    assert build.run(book, [], book / "_build" / "html") != 0
    out = capsys.readouterr().out
    assert "page page failed to execute" in out
    assert "raise RuntimeError('the chapter is broken')" in out  # the cell
    assert "RuntimeError: the chapter is broken" in out  # the error
    assert "FAILED" in out


@pytest.mark.timeout(300)
def test_a_failed_page_is_never_published_as_built(tmp_path, capsys, monkeypatch):
    """Broken by its environment (not by an edit), the page fails; built again unchanged it fails again (it is
    executed again, not reused); repaired, the build succeeds and every code cell of the page has its output."""
    cells = ["print('first cell')", "import os\nassert os.environ.get('TL_BREAK') != '1', 'broken here'",
             "print('third cell')"]
    book = make_book(tmp_path, "\n```\n\n```{code-cell} ipython3\n".join(cells))
    html = book / "_build" / "html"
    monkeypatch.setenv("TL_BREAK", "1")
    for _ in range(2):
        assert build.run(book, [], html) != 0
        out = capsys.readouterr().out
        assert "page page failed to execute" in out and "FAILED" in out, out
    monkeypatch.delenv("TL_BREAK")
    built(book, capsys)
    page = (html / "page.html").read_text()
    assert page.count('class="cell docutils container"') == 3
    assert page.count('class="cell_output docutils container"') == 2  # the middle cell prints nothing
    assert "first cell" in page and "third cell" in page


@pytest.mark.timeout(300)
def test_launch_buttons_only_with_a_repository_url(tmp_path, capsys):
    without = make_book(tmp_path / "a", "print(1)")
    built(without, capsys)
    assert "mybinder.org" not in (without / "_build" / "html" / "page.html").read_text()
    with_url = make_book(tmp_path / "b", "print(1)", repository="https://github.com/org/transformer-math-lab")
    built(with_url, capsys)
    page = (with_url / "_build" / "html" / "page.html").read_text()
    assert "https://mybinder.org/v2/gh/org/transformer-math-lab/" in page


def test_claim_counts_count_guards_in_code_cells_only(tmp_path):
    (tmp_path / "chapters").mkdir()
    (tmp_path / "chapters" / "01-x.md").write_text(
        HEADER + "We claim(nothing) in prose.\n\n```{code-cell} ipython3\n:tags: [remove-cell]\n\n"
        "claim(a > b, 'a exceeds b')\nfor k in ks:\n    claim(k > 0, 'every k is positive')\npage.claim(1, 'x')\n"
        "my_claim(2)\n```\n")
    assert build.claim_counts(tmp_path) == {"01-x": 3}
