"""Sphinx extension: drop sphinx-thebe's scripts from every page.

Jupyter Book 1.x always loads sphinx-thebe. This book starts no live kernels from the website (the launch buttons
open JupyterHub, Binder or Colab instead), and thebe's inline config names an off-host URL and is added twice per
page (a console error: "Identifier 'THEBE_JS_URL' has already been declared").
"""

from sphinx.application import Sphinx


def _is_thebe(script) -> bool:
    name = str(getattr(script, "filename", script) or "")
    body = str(getattr(script, "attributes", {}).get("body", ""))
    return name.endswith("sphinx-thebe.js") or "THEBE_JS_URL" in body


def strip_thebe(app: Sphinx, pagename, templatename, context, doctree) -> None:
    if "script_files" in context:
        context["script_files"] = [s for s in context["script_files"] if not _is_thebe(s)]


def setup(app: Sphinx) -> dict:
    app.connect("html-page-context", strip_thebe, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
