"""`make lab` (tools/lab.py): the student notebooks, the command line, and a chapter in JupyterLab with MyST rendered.

The browser test starts JupyterLab on a free port with its own config, data, runtime and settings folders,
opens chapter 2's student notebook in Debian's Chromium (driven by Playwright) and checks that jupyterlab-myst
rendered it: exercise blocks as exercises, math typeset, no raw directive or role text, no solution. Set
``TL_SCREENSHOTS=DIR`` to keep a screenshot of the exercises.
"""

import json
import os
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import nbformat
import pytest
from conftest import ROOT
from lab import OVERRIDES, lab_command, student_path, write_student_notebooks

CHROMIUM = Path("/usr/bin/chromium")
CHAPTER = ROOT / "chapters" / "02-probability.md"


@pytest.fixture
def chapters(tmp_path):
    (tmp_path / "chapters").mkdir()
    shutil.copy(CHAPTER, tmp_path / "chapters" / CHAPTER.name)
    return tmp_path


def test_student_notebooks_are_written_once_and_kept(chapters):
    [path] = write_student_notebooks(chapters)
    assert path == chapters / "chapters" / "02-probability-student.ipynb"
    assert nbformat.read(path, as_version=4).cells[0].source.startswith("**Student notebook.**")
    path.write_text(path.read_text().replace("raise NotImplementedError", "return z.softmax(-1)", 1))
    assert write_student_notebooks(chapters) == []  # the student's work is never overwritten
    assert "return z.softmax(-1)" in path.read_text()


@pytest.mark.parametrize("root_user", [True, False])
def test_lab_command(chapters, root_user):
    cmd, url = lab_command(chapters, edition="student", port=9123, token="t0k", root_user=root_user)
    assert ("--allow-root" in cmd) == root_user
    assert "--port=9123" in cmd and "--ServerApp.port_retries=0" in cmd
    assert url == "http://localhost:9123/lab/tree/chapters/02-probability-student.ipynb?token=t0k"
    cmd, url = lab_command(chapters, edition="instructor", port=8888, token="t", root_user=root_user)
    assert url == "http://localhost:8888/lab/tree/chapters?token=t"


def test_make_lab_passes_edition_and_port():
    out = subprocess.run(["make", "-n", "lab", "PORT=9123", "EDITION=instructor"], cwd=ROOT, capture_output=True,
                         text=True, check=True).stdout
    assert "tools/lab.py --edition instructor --port 9123" in out
    assert "tools/lab.py --edition student --port 8888" in subprocess.run(
        ["make", "-n", "lab"], cwd=ROOT, capture_output=True, text=True, check=True).stdout


def test_markdown_chapters_open_as_notebooks():
    viewers = OVERRIDES["@jupyterlab/docmanager-extension:plugin"]["defaultViewers"]
    assert viewers == {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _settings(folder: Path) -> Path:
    """JupyterLab user settings for the test: every cell in the page (no windowing), no news pop-up."""
    for plugin, value in {"notebook-extension/tracker": {"windowingMode": "none"},
                          "apputils-extension/notification": {"fetchNews": "false"}}.items():
        path = folder / "@jupyterlab" / f"{plugin}.jupyterlab-settings"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(value))
    return folder


@pytest.fixture
def jupyterlab(chapters):
    write_student_notebooks(chapters)
    port, token = _free_port(), "test-token"
    cmd, _ = lab_command(chapters, edition="student", port=port, token=token, root_user=os.geteuid() == 0)
    env = dict(os.environ, JUPYTER_CONFIG_DIR=str(chapters / "config"), JUPYTER_DATA_DIR=str(chapters / "data"),
               JUPYTER_RUNTIME_DIR=str(chapters / "runtime"),
               JUPYTERLAB_SETTINGS_DIR=str(_settings(chapters / "settings")),
               JUPYTERLAB_WORKSPACES_DIR=str(chapters / "workspaces"))
    log = (chapters / "lab.log").open("w")
    proc = subprocess.Popen([*cmd, "--no-browser", "--ip=127.0.0.1"], env=env, stdout=log, stderr=subprocess.STDOUT)
    base = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 45
        while True:
            try:
                urllib.request.urlopen(f"{base}/api/status?token={token}", timeout=2)
                break
            except OSError:
                if proc.poll() is not None or time.monotonic() > deadline:
                    pytest.fail(f"JupyterLab did not start:\n{(chapters / 'lab.log').read_text()[-3000:]}")
                time.sleep(0.3)
        yield base, token
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


@pytest.mark.skipif(not CHROMIUM.exists(), reason="Debian's chromium is not installed (make chromium)")
@pytest.mark.timeout(120)
def test_chapter_renders_myst_in_jupyterlab(jupyterlab):
    from playwright.sync_api import sync_playwright

    base, token = jupyterlab
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM),
                                    args=["--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage"])
        try:
            page = browser.new_page(viewport={"width": 1300, "height": 900})
            page.goto(f"{base}/lab/tree/chapters/{student_path(CHAPTER).name}?token={token}")
            exercises = page.locator(".jp-MarkdownCell aside.myst-exercise")
            exercises.first.wait_for(timeout=60_000)
            # JupyterLab renders cells one after another: measure once every Markdown cell has gone through MyST
            # and every exercise block is there (else a slow machine reads a half-rendered notebook)
            page.wait_for_function(
                "n => { const cells = [...document.querySelectorAll('.jp-MarkdownCell')];"
                " return cells.length > 10 && cells.every(c => c.querySelector('.myst'))"
                " && document.querySelectorAll('.jp-MarkdownCell aside.myst-exercise').length >= n; }",
                arg=CHAPTER.read_text().count("```{exercise}"), timeout=60_000)
            rendered = page.evaluate("() => [...document.querySelectorAll('.jp-MarkdownCell .myst')]"
                                     ".map(m => m.textContent).join('\\n')")
            n_markdown = page.locator(".jp-MarkdownCell").count()
            n_rendered = page.locator(".jp-MarkdownCell .myst").count()
            n_math = page.locator(".jp-MarkdownCell .myst .katex").count()
            n_exercises = exercises.count()
            n_solutions = page.locator(".jp-MarkdownCell .myst-solution").count()
            code = page.evaluate("() => [...document.querySelectorAll('.jp-CodeCell .jp-InputArea-editor')]"
                                 ".map(e => e.textContent)")
            if os.environ.get("TL_SCREENSHOTS"):
                page.locator(".jp-MarkdownCell .myst h2", has_text="Exercises").scroll_into_view_if_needed()
                page.screenshot(path=str(Path(os.environ["TL_SCREENSHOTS"]) / "jupyterlab-ch2-exercises.png"))
        finally:
            browser.close()
    assert n_rendered == n_markdown > 10, "every Markdown cell goes through jupyterlab-myst"
    for raw in ("```{exercise}", "{exercise}", ":label:", "{doc}", "{cite", "{solution", "$$"):
        assert raw not in rendered, f"raw MyST {raw!r} shows in JupyterLab"
    expected = CHAPTER.read_text().count("```{exercise}")
    assert n_exercises == expected, f"{n_exercises} exercise blocks rendered, the chapter has {expected}"
    defining = [c for c in code if "def stable_softmax(" in c]
    assert n_solutions == 0 and len(defining) == 1 and "NotImplementedError" in defining[0], "only the stub"
    assert n_math > 50, "math is typeset (KaTeX)"
