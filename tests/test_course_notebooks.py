"""Student and instructor notebooks: solutions removed (and only those), and the student ones still run."""


import re

import jupytext
import nbformat
import pytest
from conftest import NOTEBOOK_HEADER, ROOT
from course_notebooks import chapter_pages, instructor_notebook, student_notebook
from nbclient import NotebookClient

CHAPTER = NOTEBOOK_HEADER + """
# A chapter

```{exercise}
:label: ex-double

Write `double(x)`.
```

```{code-cell} ipython3
:tags: [exercise]

def double(x):
    raise NotImplementedError  # your code here
```

```{code-cell} ipython3
print("check", double.__name__)
```

```{code-cell} ipython3
:tags: [remove-cell]

assert True  # a guard the website hides
```

```{solution-start} ex-double
:class: dropdown
```

```{code-cell} ipython3
:tags: [solution]

def double(x):
    return 2 * x
```

```{solution-end}
```

Text after the exercise stays.

````{solution} ex-other
:class: dropdown

A written solution, removed too.
````
"""


@pytest.fixture
def page(tmp_path):
    (tmp_path / "chapters").mkdir()
    path = tmp_path / "chapters" / "09-test.md"
    path.write_text(CHAPTER)
    return path


def test_student_notebook_drops_solutions_only(page):
    nb = student_notebook(page)
    text = "\n".join(c.source for c in nb.cells)
    assert "return 2 * x" not in text and "written solution" not in text
    assert "solution-start" not in text and "solution-end" not in text
    assert "raise NotImplementedError" in text and 'print("check"' in text
    assert "Text after the exercise stays." in text and "{exercise}" in text
    assert nb.cells[0].source.startswith("**Student notebook.**")
    hidden = [c.source for c in nb.cells if c.metadata.get("jupyter", {}).get("source_hidden")]
    assert hidden == ["assert True  # a guard the website hides"]


def test_instructor_notebook_keeps_everything(page):
    nb = instructor_notebook(page)
    text = "\n".join(c.source for c in nb.cells)
    assert "return 2 * x" in text and "solution-start" in text
    assert len(nb.cells) == len(jupytext.read(page).cells) + 1


def test_chapter_pages_are_notebooks(page):
    assert chapter_pages(page.parent.parent) == [page]


STUDENT_PAGES = chapter_pages(ROOT)


@pytest.mark.notebooks
@pytest.mark.timeout(300)
@pytest.mark.parametrize("chapter", STUDENT_PAGES, ids=[p.stem for p in STUDENT_PAGES])
def test_student_notebook_runs_with_stubs_unfilled(chapter):
    nb = student_notebook(chapter)
    stubs = [c for c in nb.cells if "exercise" in c.metadata.get("tags", [])]
    assert stubs, f"{chapter.name} has no exercise stubs"
    names = [m for c in stubs for m in re.findall(r"^def (\w+)\(", c.source, re.M)]
    # After "Run all", each exercise name must still be the student's stub, not a solution defined later.
    nb.cells.append(nbformat.v4.new_code_cell(
        f"assert all('NotImplementedError' in f.__code__.co_names for f in [{', '.join(names)}])"))
    NotebookClient(nb, timeout=120, kernel_name="python3",
                   resources={"metadata": {"path": str(chapter.parent)}}).execute()
