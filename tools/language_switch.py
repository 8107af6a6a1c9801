"""Sphinx extension: on every page, a link to the same page in the book's other language.

The English edition is built into ``_build/html`` and the Chinese one, from the same sources and the same executed
notebooks, into ``_build/html/zh`` (``tools/i18n.py``). Each page of one links to its twin in the other: the button
``中文`` / ``English`` in the article's header (``book/_templates/language-switch.html``) and a
``<link rel="alternate" hreflang>`` for search engines. The student edition and single-page builds have no twin, and
no switch (``tl_language_switch: false``).
"""

from __future__ import annotations

from sphinx.application import Sphinx

EDITIONS = {"en": ("zh/", "zh-CN", "中文", "这一页的中文版"), "zh": ("../", "en", "English", "This page in English")}


def _switch(app: Sphinx, pagename: str, templatename: str, context: dict, doctree) -> None:
    if not app.config.tl_language_switch or getattr(app.config, "tl_edition", "instructor") == "student":
        return
    here = "zh" if (app.config.language or "").startswith("zh") else "en"
    to_other, hreflang, label, title = EDITIONS[here]
    href = "../" * pagename.count("/") + to_other + pagename + ".html"
    context["language_switch"] = {"href": href, "hreflang": hreflang, "label": label, "title": title}
    context["metatags"] = context.get("metatags", "") + f'\n<link rel="alternate" hreflang="{hreflang}" href="{href}"/>'


def setup(app: Sphinx) -> dict:
    app.add_config_value("tl_language_switch", True, "html")
    app.connect("html-page-context", _switch)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
