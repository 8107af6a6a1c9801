"""Sphinx extension: load the ipywidgets HTML manager only on pages that embed a widget view.

MyST-NB adds the manager (``nb_ipywidgets_js`` in _config.yml: 3.7 MB) and the notebook's widget state to every
page whose notebook created a widget. This book's figures show pre-rendered frames on the website instead
(``nb_mime_priority_overrides``), so no page embeds a view and the manager would be dead weight.
"""

from sphinx.application import Sphinx

WIDGET_VIEW = "application/vnd.jupyter.widget-view+json"
WIDGET_STATE = "application/vnd.jupyter.widget-state+json"


def _is_widget_script(script, manager: set[str]) -> bool:
    name = str(getattr(script, "filename", script) or "")
    return name in manager or getattr(script, "attributes", {}).get("type") == WIDGET_STATE


def strip_widget_manager(app: Sphinx, pagename, templatename, context, doctree) -> None:
    if "script_files" not in context or WIDGET_VIEW in context.get("body", ""):
        return
    manager = {f"_static/{name}" for name in app.config.nb_ipywidgets_js}  # as Sphinx's add_js_file names them
    context["script_files"] = [s for s in context["script_files"] if not _is_widget_script(s, manager)]


def setup(app: Sphinx) -> dict:
    app.connect("html-page-context", strip_widget_manager, priority=900)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
