"""Sphinx extension: re-execute the book's notebooks when the package they import changes.

MyST-NB's execution cache keys a notebook by its own code only (MyST-NB issue #299), so a change to
``transformer_lab/`` would leave stale outputs. At each build this extension hashes every file of the package.
When the hash differs from the one stored beside the cache, it empties the execution cache, so each page is
executed again. When it differs from the one this build's Sphinx environment last read its pages with, it marks
every notebook page outdated, so each is read again: the two are kept apart because several builds share one
cache (the English site, the Chinese one, the gettext templates), and the first of them after a change executes
the pages, the others read them from the cache but must still read them. With nothing changed it does nothing.

It also marks outdated every notebook page whose execution failed in the previous build. Sphinx would otherwise
keep that page's half-executed doctree (its source did not change), and a second build would publish the broken
page and report success; executed again, the page fails again until it is repaired.
"""

from __future__ import annotations

import hashlib
import shutil
from pathlib import Path

from sphinx.application import Sphinx
from sphinx.util import logging

logger = logging.getLogger(__name__)
PACKAGE = "transformer_lab"
STAMP = "transformer_lab.sha256"


def package_hash(root: Path) -> str:
    """sha256 over the relative paths and bytes of every source file under ``root/transformer_lab``."""
    h = hashlib.sha256()
    for path in sorted((root / PACKAGE).rglob("*")):
        if path.is_file() and "__pycache__" not in path.parts and path.suffix != ".pyc":
            h.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return h.hexdigest()


def _cache_dir(app: Sphinx) -> Path:
    return Path(app.config.nb_execution_cache_path or Path(app.outdir).parent / ".jupyter_cache")


def _is_notebook(path: Path) -> bool:
    return path.suffix == ".ipynb" or (path.suffix == ".md" and "kernelspec:" in path.read_text(encoding="utf8")[:2000])


def on_builder_inited(app: Sphinx) -> None:
    cache = _cache_dir(app)
    stamp = cache / STAMP
    new = package_hash(Path(app.srcdir))
    app.env.lab_package_changed = getattr(app.env, "lab_package_hash", None) != new  # this build's own pages
    app.env.lab_package_hash = new
    old = stamp.read_text().strip() if stamp.is_file() else None
    if old == new:
        return
    if cache.exists():
        logger.info(f"[lab_cache] {PACKAGE}/ changed: clearing the execution cache, re-executing every notebook")
        shutil.rmtree(cache)
    cache.mkdir(parents=True, exist_ok=True)
    stamp.write_text(new + "\n")


def failed_pages(env) -> set[str]:
    """The pages whose notebook failed to execute when they were last read (MyST-NB's execution data)."""
    return {doc for doc, data in getattr(env, "nb_metadata", {}).items()
            if (data.get("exec_data") or {}).get("succeeded") is False}


def on_env_get_outdated(app: Sphinx, env, added, changed, removed) -> list[str]:
    unchanged = env.found_docs - set(added) - set(changed)
    again = unchanged & failed_pages(env)
    if again:
        logger.info(f"[lab_cache] executing again what failed last time: {', '.join(sorted(again))}")
    if not getattr(env, "lab_package_changed", False):
        return sorted(again)
    src = Path(app.srcdir)
    notebooks = {doc for doc in unchanged
                 if (p := Path(env.doc2path(doc))).is_file() and _is_notebook(p if p.is_absolute() else src / p)}
    return sorted(again | notebooks)


def setup(app: Sphinx) -> dict:
    app.connect("builder-inited", on_builder_inited)
    app.connect("env-get-outdated", on_env_get_outdated)
    return {"parallel_read_safe": True, "parallel_write_safe": True, "env_version": 1}
