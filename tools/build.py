"""Build the book with warnings as errors, and say clearly what failed.

    python tools/build.py                         # the whole book into _build/html, in Chinese into _build/html/zh
                                                  # (what `make book` runs)
    python tools/build.py chapters/03-optimization.md [...]
    python tools/build.py --edition student       # the student edition into _build/student/_build/html

With pages named, every page is still rendered (so cross-references resolve) but only those are executed,
into ``_build/pages/<first page's name>/`` with their own execution cache: a quick check of one chapter while
writing it that leaves ``_build/html`` alone. On failure it prints each warning and, for a page whose code
raised, the page, the cell and the traceback; it exits non-zero.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import i18n  # tools/i18n.py, beside this script
import yaml

ROOT = Path(__file__).resolve().parent.parent
JB = [str(Path(sys.executable).parent / "jupyter-book")]


def execution_reports(html_dir: Path, since: float = 0.0) -> list[str]:
    """One readable paragraph per page that failed to execute (in a report written after ``since``, a time
    stamp, so that reports left by earlier builds do not count): the page, the failing cell and the error."""
    out = []
    for log in sorted((html_dir / "reports").rglob("*.err.log")):
        if log.stat().st_mtime < since:
            continue
        page = log.relative_to(html_dir / "reports").as_posix().removesuffix(".err.log")
        text = re.sub(r"\x1b\[[0-9;]*m", "", log.read_text(errors="replace"))
        cell = re.search(r"^-{5,}\n(.*?)^-{5,}\n", text, re.S | re.M)
        where = re.findall(r"^Cell In\[\d+\], line \d+", text, re.M)
        errors = re.findall(r"^[A-Za-z_][\w.]*(?:Error|Exception|Exit|Interrupt|Warning)\b.*$", text, re.M)
        out.append(f"page {page} failed to execute.\n  cell{' (' + where[-1] + ')' if where else ''}:\n"
                   + "\n".join("    " + line for line in (cell.group(1).rstrip() if cell else "?").splitlines())
                   + f"\n  error: {errors[-1] if errors else '(see the report)'}\n  full report: {log}")
    return out


CODE_CELL = re.compile(r"^```\{code-cell\}[^\n]*\n(.*?)^```$", re.S | re.M)
CLAIM_CALL = re.compile(r"(?<!\w)claim\(")


def claim_counts(root: Path = ROOT) -> dict[str, int]:
    """How many sentences each chapter guards: the ``claim(...)`` calls (``transformer_lab.page.claim``) in its
    code cells, by page name. A call inside a loop guards each frame it visits but is counted once here."""
    return {page.stem: sum(len(CLAIM_CALL.findall(cell)) for cell in CODE_CELL.findall(page.read_text()))
            for page in sorted((root / "chapters").glob("*.md"))}


def run(root: Path, extra: list[str], html_dir: Path) -> int:
    t0, started = time.perf_counter(), time.time()
    proc = subprocess.run([*JB, "build", str(root), "-W", "-n", "--keep-going", *extra], cwd=root,
                          capture_output=True, text=True)
    log = re.sub(r"\x1b\[[0-9;]*m", "", proc.stdout + proc.stderr)
    (html_dir.parent).mkdir(parents=True, exist_ok=True)
    (html_dir.parent / "build.log").write_text(log)
    executed = len(re.findall(r"Executing notebook using", log))
    cached = len(re.findall(r"Using cached notebook", log))
    warnings = [ln for ln in log.splitlines() if re.search(r"\b(WARNING|ERROR|CRITICAL)\b", ln)
                and "IPKernelApp" not in ln]
    for w in warnings:
        print(w)
    reports = execution_reports(html_dir, since=started)
    for r in reports:
        print("\n" + r)
    if proc.returncode and not warnings and not reports:
        print("\n".join(log.splitlines()[-40:]))
    counts = claim_counts(root)
    print("guarded claims per page: " + ", ".join(f"{page} {n}" for page, n in counts.items())
          + f" ({sum(counts.values())} in all)")
    took = time.perf_counter() - t0
    status = "built" if proc.returncode == 0 else "FAILED"
    print(f"{status} {html_dir} in {took:.0f} s: {executed} notebook(s) executed, {cached} from cache, "
          f"{len(warnings)} warning(s) (log: {html_dir.parent / 'build.log'})")
    return proc.returncode or (1 if reports else 0)


def main(pages: list[str]) -> int:
    subprocess.run(["bash", str(ROOT / "tools" / "fetch_assets.sh")], check=True)
    if pages[:1] == ["--edition"]:  # the whole book in one edition (tools/edition.py); the default is the full one
        if pages[1:] not in (["instructor"], ["student"]):
            print("--edition takes one of: instructor, student", file=sys.stderr)
            return 2
        if pages[1] == "instructor":
            return main([])
        os.environ["TL_EDITION"] = "student"  # read by tools/edition.py in the Sphinx run
        out = ROOT / "_build" / "student"
        return run(ROOT, ["--path-output", str(out)], out / "_build" / "html")
    if not pages:  # the English site, then the Chinese one beside it (tools/i18n.py)
        return run(ROOT, [], ROOT / "_build" / "html") or i18n.build([], run)
    targets = [Path(p).resolve().relative_to(ROOT).as_posix() for p in pages]
    for t in targets:
        if not (ROOT / t).is_file():
            print(f"no such page: {t}", file=sys.stderr)
            return 2
    out = ROOT / "_build" / "pages" / Path(targets[0]).stem
    out.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    config["execute"]["exclude_patterns"] = [
        p.relative_to(ROOT).as_posix() for d in ("book", "chapters") for p in (ROOT / d).glob("*.md")
        if p.relative_to(ROOT).as_posix() not in targets]
    config["execute"]["cache"] = str(out / ".jupyter_cache")
    config["sphinx"]["local_extensions"] = {k: str(ROOT / v) for k, v in config["sphinx"]["local_extensions"].items()}
    config["sphinx"]["config"]["tl_language_switch"] = False  # no Chinese twin of a single-page build
    (out / "_config.yml").write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False))
    return run(ROOT, ["--config", str(out / "_config.yml"), "--path-output", str(out)], out / "_build" / "html")


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
