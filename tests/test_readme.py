"""The README is a short front door: at most 200 lines, and every benchmark ratio it quotes is a saved one."""

import json
import re

from conftest import ROOT

README = (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_is_at_most_200_lines():
    assert len(README.splitlines()) <= 200


def test_readme_benchmark_ratios_are_the_saved_ones():
    """Each row `| `name` | ... | 1.23 |` of the README's benchmark table quotes results/name.json's first ratio."""
    rows = re.findall(r"^\| `(\w+)` \| (.+?) \| ([\d.]+)x? \|$", README, flags=re.M)
    assert rows
    for name, compares, ratio in rows:
        first = json.loads((ROOT / "benchmarks" / "results" / f"{name}.json").read_text(encoding="utf-8"))["rows"][0]
        assert (compares, f"{first['ratio']:.2f}") == (first["compares"], ratio), name
