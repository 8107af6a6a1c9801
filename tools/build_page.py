"""Build the whole book but execute only the given pages: a fast check of one chapter while writing it.

    python tools/build_page.py chapters/03-optimization.md [more pages ...]

Every page is rendered (so cross-references resolve), only the named ones are executed, with warnings as
errors, into ``_build/pages/<first page's name>/`` with its own execution cache, so several of these can run
side by side without touching ``_build/html``. Exits non-zero, after printing the failing cell, on any error.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent


def main(pages: list[str]) -> int:
    if not pages:
        print(__doc__, file=sys.stderr)
        return 2
    targets = [Path(p).resolve().relative_to(ROOT).as_posix() for p in pages]
    for t in targets:
        if not (ROOT / t).is_file():
            print(f"no such page: {t}", file=sys.stderr)
            return 2
    out = ROOT / "_build" / "pages" / Path(targets[0]).stem
    out.mkdir(parents=True, exist_ok=True)
    config = yaml.safe_load((ROOT / "_config.yml").read_text())
    others = [p.relative_to(ROOT).as_posix() for d in ("book", "chapters") for p in (ROOT / d).glob("*.md")
              if p.relative_to(ROOT).as_posix() not in targets]
    config["execute"]["exclude_patterns"] = others
    config["execute"]["cache"] = str(out / ".jupyter_cache")
    config["sphinx"]["local_extensions"] = {k: str(ROOT / v) for k, v in config["sphinx"]["local_extensions"].items()}
    (out / "_config.yml").write_text(yaml.safe_dump(config, allow_unicode=True, sort_keys=False))
    subprocess.run(["bash", str(ROOT / "tools" / "fetch_assets.sh")], check=True)
    cmd = ["jupyter-book", "build", str(ROOT), "--config", str(out / "_config.yml"), "--path-output", str(out),
           "-W", "-n", "--keep-going"]
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    (out / "build.log").write_text(log)
    problems = [line for line in log.splitlines() if ("WARNING" in line or "ERROR" in line) and "IPKernelApp" not in line]
    print("\n".join(problems) or "no warnings")
    if proc.returncode and not problems:
        print("\n".join(log.splitlines()[-40:]))
    for report in sorted((out / "_build" / "html" / "reports").rglob("*.log")):
        print(f"\n--- execution report {report.relative_to(out)} ---\n{report.read_text()}")
    status = "built" if proc.returncode == 0 else "FAILED"
    print(f"{status}: {out / '_build' / 'html'} (full log: {out / 'build.log'})")
    return proc.returncode


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
