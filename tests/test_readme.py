"""The README is a short front door: at most 200 lines, and every benchmark ratio it quotes is a saved one."""

import json
import re

from conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_is_at_most_200_lines():
    assert len(README.splitlines()) <= 200


def test_readme_benchmark_ratios_are_the_saved_ones():
    """One row `| `name` | what | 1.2345 |` per result file, quoting its first row exactly."""
    rows = re.findall(r"^\| `(\w+)` \| (.+?) \| ([\d.]+) \|$", README, flags=re.M)
    saved = sorted(p.stem for p in (ROOT / "benchmarks" / "results").glob("*.json"))
    assert sorted(name for name, _, _ in rows) == saved
    for name, compares, ratio in rows:
        first = json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text(encoding="utf-8"))["rows"][0]
        assert (compares, ratio) == (first["compares"], str(first["ratio"])), name
