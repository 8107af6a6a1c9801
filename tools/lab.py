"""`make lab`: JupyterLab on the chapters, the student edition by default.

    python tools/lab.py [--edition student|instructor] [--port 8888]

* student (default): each chapter opens as ``chapters/NN-name-student.ipynb``, the student notebook of
  ``tools/course_notebooks.py`` (solutions removed, exercise stubs in place). A missing one is written; an
  existing one is kept, since it holds the student's work (delete it to start again). Git ignores them.
* instructor: the chapters themselves, ``chapters/*.md``, open as notebooks (Jupytext), solutions in; saving
  one leaves the file byte-identical (``jupytext.toml``).

MyST (admonitions, math, exercise and solution blocks) is rendered by the jupyterlab-myst extension. As root
(containers, course VMs) it passes ``--allow-root``. It prints the URL, with a fresh token, before starting.
"""

from __future__ import annotations

import argparse
import json
import os
import secrets
import sys
from pathlib import Path

import nbformat
from course_notebooks import chapter_pages, student_notebook

ROOT = Path(__file__).resolve().parent.parent
# .md files open as notebooks through Jupytext; written to the environment's JupyterLab settings.
OVERRIDES = {"@jupyterlab/docmanager-extension:plugin": {
    "defaultViewers": {"markdown": "Jupytext Notebook", "myst": "Jupytext Notebook"}}}


def student_path(page: Path) -> Path:
    return page.with_name(f"{page.stem}-student.ipynb")


def write_student_notebooks(root: Path) -> list[Path]:
    """Write each chapter's student notebook beside it unless it exists; return the ones written."""
    written = []
    for page in chapter_pages(root):
        path = student_path(page)
        if not path.exists():
            nbformat.write(student_notebook(page), path)
            written.append(path)
    return written


def lab_command(root: Path, *, edition: str, port: int, token: str, root_user: bool) -> tuple[list[str], str]:
    """(the ``jupyter lab`` command line, the URL it will serve the chapters at)."""
    start = "chapters" if edition == "instructor" else f"chapters/{student_path(chapter_pages(root)[0]).name}"
    cmd = [str(Path(sys.executable).parent / "jupyter"), "lab", f"--notebook-dir={root}", f"--port={port}",
           "--ServerApp.port_retries=0", f"--IdentityProvider.token={token}",
           f"--ServerApp.default_url=/lab/tree/{start}"]
    if root_user:
        cmd.append("--allow-root")
    return cmd, f"http://localhost:{port}/lab/tree/{start}?token={token}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="JupyterLab on the chapters (make lab).")
    parser.add_argument("--edition", choices=["student", "instructor"], default="student",
                        help="student: notebooks without solutions (default); instructor: the chapters, solutions in")
    parser.add_argument("--port", type=int, default=8888, help="the port to serve on (default 8888)")
    args = parser.parse_args(argv)
    settings = Path(sys.prefix) / "share" / "jupyter" / "lab" / "settings"
    settings.mkdir(parents=True, exist_ok=True)
    (settings / "overrides.json").write_text(json.dumps(OVERRIDES, indent=2) + "\n")
    if args.edition == "student":
        for path in write_student_notebooks(ROOT):
            print(f"wrote {path.relative_to(ROOT)}")
        print("student edition: chapters/*-student.ipynb (no solutions; yours to edit, kept between runs). "
              "The instructor's: make lab EDITION=instructor")
    cmd, url = lab_command(ROOT, edition=args.edition, port=args.port, token=secrets.token_hex(16),
                           root_user=os.geteuid() == 0)
    print(f"\nJupyterLab: {url}\n", flush=True)
    os.execv(cmd[0], cmd)


if __name__ == "__main__":
    raise SystemExit(main())
