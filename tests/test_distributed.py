"""Data parallelism under torchrun (issue 16): two gloo processes on this CPU.

Every rank draws the global batch from one seeded stream and keeps its rows, so 2 processes x 4 windows, and
1 process x 8 windows, train on the same windows; their losses agree to float32 round-off (the mean over 8 rows is
summed in another order). A job whose rank dies stops with torchrun's report and our message, keeps the last
checkpoint, and ``--resume`` under torchrun then finishes the run exactly as the uninterrupted job did.
"""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from transformer_lab.cli import load_model
from transformer_lab.data import shakespeare

ROOT = Path(__file__).resolve().parent.parent
TORCHRUN = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
MODEL = ["--max-iters", "6", "--block-size", "16", "--n-layer", "1", "--n-head", "2", "--d-model", "16",
         "--eval-interval", "3", "--eval-iters", "2", "--warmup", "1", "--quiet", "--no-compile", "--threads", "1",
         "--device", "cpu"]


def _run(cmd, tmp, **env):
    full = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT), **env}
    return subprocess.run(cmd, cwd=tmp, env=full, capture_output=True, text=True, timeout=120)


def _losses(path):
    return json.loads(Path(path).read_text())["history"]["loss"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ddp")
    (tmp / "t.txt").write_text(shakespeare()[:20_000], encoding="utf-8")
    train = ["train", "--text", "t.txt", *MODEL]
    two = _run([*TORCHRUN, "-m", "transformer_lab", *train, "--batch-size", "4", "--out", "two.json"], tmp)
    one = _run([sys.executable, "-m", "transformer_lab", *train, "--batch-size", "8", "--out", "one.json"], tmp)
    dead = _run([*TORCHRUN, str(ROOT / "tests" / "torchrun_fault.py"), *train, "--batch-size", "4",
                 "--out", "cut.json"], tmp, DIE_RANK="1", DIE_STEP="4")
    steps_kept = json.loads((tmp / "cut.json").read_text())["step"] if (tmp / "cut.json").exists() else None
    if steps_kept is not None:  # a copy of the step-3 checkpoint, to be resumed by one process
        (tmp / "solo").mkdir()
        for f in tmp.glob("cut.*"):
            shutil.copy(f, tmp / "solo" / f.name)
    resumed = _run([*TORCHRUN, "-m", "transformer_lab", *train, "--batch-size", "4", "--out", "cut.json",
                    "--resume"], tmp)
    solo = _run([sys.executable, "-m", "transformer_lab", *train, "--batch-size", "4", "--grad-accum", "2",
                 "--out", "solo/cut.json", "--resume"], tmp)
    return tmp, two, one, dead, steps_kept, resumed, solo


def test_two_gloo_processes_equal_one_process_with_the_same_global_batch(runs):
    tmp, two, one, *_ = runs
    assert two.returncode == 0, two.stderr[-2000:]
    assert one.returncode == 0, one.stderr[-2000:]
    assert "2 process(es) x 1 micro-batch(es) of 4 = 8 windows a step" in two.stdout
    a, b = _losses(tmp / "two.json"), _losses(tmp / "one.json")
    assert len(a) == len(b) == 6
    assert max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5, (a, b)
    assert two.stdout.count("done:") == 1  # only rank 0 reports


def test_a_rank_that_dies_stops_the_job_with_a_clear_message(runs):
    *_, dead, steps_kept, _, _ = runs
    assert dead.returncode != 0
    report = dead.stdout + dead.stderr
    assert "ChildFailedError" in report or "another process of this torchrun job stopped" in report, report[-3000:]
    assert "exitcode" in report and "3" in report  # torchrun names the failed rank's exit status
    assert steps_kept == 3  # the checkpoint written at step 3 survives


def test_resume_under_torchrun_equals_the_uninterrupted_job(runs):
    tmp, _two, _, _, _, resumed, _ = runs
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    assert "resuming" in resumed.stdout and "at step 3 of 6" in resumed.stdout
    assert _losses(tmp / "cut.json") == _losses(tmp / "two.json")


def test_a_checkpoint_from_two_processes_loads_in_one(runs):
    tmp, *_ = runs
    _model, _tok, record = load_model(tmp / "two.json")
    assert record["world_size"] == 2
    out = _run([sys.executable, "-m", "transformer_lab", "sample", "--checkpoint", "two.json", "--tokens", "20",
                "--device", "cpu"], tmp)
    assert out.returncode == 0 and len(out.stdout) > 20, out.stderr


def test_one_process_resumes_a_two_process_checkpoint_with_the_same_global_batch(runs):
    """2 processes x 4 windows wrote it; 1 process x 2 micro-batches of 4 continues it: the same windows."""
    tmp, *_, solo = runs
    assert solo.returncode == 0, solo.stderr[-2000:]
    assert "at step 3 of 6" in solo.stdout and "1 process(es) x 2 micro-batch(es) of 4" in solo.stdout
    a, b = _losses(tmp / "solo" / "cut.json"), _losses(tmp / "two.json")
    assert a[:3] == b[:3] and max(abs(x - y) for x, y in zip(a, b, strict=True)) < 1e-5, (a, b)
