"""Sphinx extension: launch buttons only when the repository's URL is set.

``_config.yml`` names the launch services (Binder, a course's JupyterHub); the buttons point at
``repository.url``. While that URL is empty there is nothing to launch, so no button is shown (sphinx-book-theme
would otherwise fail on the missing repository). Setting ``repository.url`` is then the single setting that
turns them on.
"""

from sphinx.application import Sphinx


def drop_launch_buttons_without_repository(app: Sphinx, config) -> None:
    options = config.html_theme_options
    if not str(options.get("repository_url") or "").strip():
        options["launch_buttons"] = {}


def setup(app: Sphinx) -> dict:
    app.connect("config-inited", drop_launch_buttons_without_repository)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
