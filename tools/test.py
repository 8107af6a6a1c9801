"""`make test`: build the book and run the whole suite, the tests that need no build beside the build.

    python tools/test.py [--workers N]

Building the book executes its pages one after another, on one core. The tests that need no built site (every
page executed again as another machine would, the student notebooks, the compiled and interrupted trainings) run
meanwhile on the other cores; once both editions are built, the rest of the suite (the website in Chromium, the
PDF, the translation) runs on every core, each process with one thread (``OMP_NUM_THREADS=1`` unless set): several
torch processes that each spin up a thread per core slow one another down many times over on a loaded machine.
With one worker everything runs in turn: the build, then the suite. The output
of the tests that ran beside the build is printed when they end. The exit status is non-zero when the build or
any test failed.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PYTHON = sys.executable
BESIDE_THE_BUILD = ["tests/test_notebooks.py", "tests/test_course_notebooks.py", "tests/test_train_compile.py",
                    "tests/test_crash_resume.py"]  # need no _build/: they execute pages and train themselves
BUILDS = [["tools/build.py"], ["tools/build.py", "--edition", "student"]]


def pytest(args: list[str], workers: int) -> list[str]:
    spread = ["-n", str(workers), "--dist", "worksteal"] if workers > 1 else []
    return [PYTHON, "-m", "pytest", *spread, *args]


def build() -> int:
    for step in BUILDS:
        if status := subprocess.run([PYTHON, *step], cwd=ROOT).returncode:
            return status
    return 0


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--workers", type=int, default=min(os.cpu_count() or 1, 4),
                    help="test processes in all (default: one per core, at most four)")
    workers = max(1, ap.parse_args(argv).workers)
    if workers > 1:  # one process per core: a second torch thread in each would only contend for the same cores
        os.environ.setdefault("OMP_NUM_THREADS", "1")
    t0 = time.perf_counter()
    if workers == 1:
        status = build() or subprocess.run(pytest([], 1), cwd=ROOT).returncode
        print(f"make test: {'passed' if status == 0 else 'FAILED'} in {time.perf_counter() - t0:.0f} s")
        return status
    log = ROOT / "_build" / "tests-beside-the-build.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("w") as out:  # half the workers beside the build, then all of them on the rest
        beside = subprocess.Popen(pytest(BESIDE_THE_BUILD, max(1, workers // 2)), cwd=ROOT, stdout=out,
                                  stderr=subprocess.STDOUT)
        built = build()
        rest = 2 if built else subprocess.run(  # every worker: the tests beside the build are near their end
            pytest([f"--ignore={p}" for p in BESIDE_THE_BUILD], workers), cwd=ROOT).returncode
        first = beside.wait()
    print(f"\n--- the tests that ran beside the build ({', '.join(Path(p).stem for p in BESIDE_THE_BUILD)}):")
    print(log.read_text(), end="")
    status = built or rest or first
    print(f"make test: {'passed' if status == 0 else 'FAILED'} in {time.perf_counter() - t0:.0f} s "
          f"(build {'ok' if built == 0 else 'FAILED'}; suite {'ok' if rest == 0 else 'FAILED'}; "
          f"beside the build {'ok' if first == 0 else 'FAILED'})")
    return status


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
