"""Opening and saving a chapter in JupyterLab leaves its tracked .md byte-identical.

JupyterLab reads and writes ``chapters/*.md`` through Jupytext's contents manager, which takes its settings from
the repository's ``jupytext.toml``. Here each chapter goes through that same contents manager: read, given the
metadata JupyterLab adds while you work (cell ``editable``/``slideshow``/``trusted``/``execution``, collapsed
headings, the notebook's ``language_info`` and widget state), saved, and compared byte for byte.
"""

import shutil

import pytest
from conftest import ROOT
from jupytext.sync_contentsmanager import TextFileContentsManager

CHAPTERS = sorted((ROOT / "chapters").glob("*.md"))


@pytest.fixture(scope="module")
def manager(tmp_path_factory):
    root = tmp_path_factory.mktemp("lab")
    shutil.copy(ROOT / "jupytext.toml", root / "jupytext.toml")
    (root / "chapters").mkdir()
    return TextFileContentsManager(root_dir=str(root))


@pytest.mark.parametrize("chapter", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_open_and_save_leaves_the_chapter_byte_identical(manager, chapter):
    path = f"chapters/{chapter.name}"
    copy = ROOT.joinpath(manager.root_dir, path)
    shutil.copy(chapter, copy)
    model = manager.get(path)
    nb = model["content"]
    nb.metadata["language_info"] = {"name": "python", "version": "3.11"}
    nb.metadata["widgets"] = {"application/vnd.jupyter.widget-state+json": {"state": {}}}
    for cell in nb.cells:
        cell.metadata.update(editable=True, slideshow={"slide_type": ""}, trusted=True,
                             execution={"iopub.status.idle": "2026-01-01T00:00:00Z"})
        if cell.cell_type == "markdown":
            cell.metadata["jp-MarkdownHeadingCollapsed"] = True
    manager.save(model, path)
    assert copy.read_bytes() == chapter.read_bytes(), (
        f"saving {chapter.name} from JupyterLab would change it; normalise it once with "
        f"`.venv/bin/jupytext --to myst chapters/{chapter.name}` (reads jupytext.toml)")

