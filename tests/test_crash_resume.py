"""Crash anywhere, and two writers (chapter 8, issue 12).

A tiny training run (``python -m transformer_lab train``) is killed with SIGKILL at random moments and inside
saves, several times: after every kill the last checkpoint loads, and ``--resume`` finishes with exactly the
history and final loss of an uninterrupted run. A second trainer pointed at the same ``--out`` gets a clear error
(the lock file), and a lock left by a killed trainer is taken over."""

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from transformer_lab import checkpoint as ckpt
from transformer_lab import cli
from transformer_lab.data import shakespeare

pytestmark = pytest.mark.timeout(240)

ARGS = ["--n-layer", "1", "--n-head", "2", "--d-model", "16", "--block-size", "16", "--batch-size", "4",
        "--max-iters", "60", "--warmup", "2", "--eval-interval", "5", "--eval-iters", "1", "--quiet", "--no-compile",
        "--threads", "1", "--seed", "11", "--dropout", "0.1"]
ENV = {**os.environ, "PYTHONUNBUFFERED": "1", "OMP_NUM_THREADS": "1"}

# Runs the CLI, but SIGKILLs itself inside the K-th atomic write (half the file written): a kill inside a save.
DIE_IN_SAVE = """
import os, signal, sys
from transformer_lab import checkpoint as ckpt, cli
real, calls, K = ckpt._atomic_write, [0], int(sys.argv[1])
def dying(path, write):
    calls[0] += 1
    if calls[0] != K:
        return real(path, write)
    def half(tmp):
        write(tmp)
        data = open(tmp, "rb").read()
        open(tmp, "wb").write(data[: len(data) // 2])
        os.kill(os.getpid(), signal.SIGKILL)
    return real(path, half)
ckpt._atomic_write = dying
sys.exit(cli.main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("text") / "plays.txt"
    path.write_text(shakespeare()[:12_000], encoding="utf-8")
    return path


def _argv(text, out, *, resume):
    return ["train", "--text", str(text), "--out", str(out), *ARGS, *(["--resume"] if resume else [])]


def _start(argv, *, die_in_save=None):
    cmd = ([sys.executable, "-c", DIE_IN_SAVE, str(die_in_save)] if die_in_save else
           [sys.executable, "-m", "transformer_lab"]) + argv
    return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV)


def _last_good(out: Path) -> int | None:
    """The step of the checkpoint at ``out`` (it must load for sampling and for resuming), or None."""
    if not out.exists():
        return None
    record, _ = ckpt.read(out)
    cli.load_model(out)
    return record["step"]


def test_killed_anywhere_the_last_checkpoint_loads_and_resume_matches(text, tmp_path):
    t0 = time.perf_counter()
    ref = tmp_path / "ref" / "run.json"
    # two writers: a trainer that finds --out's lock held by a live process is refused and leaves the lock alone.
    # This test process holds it, standing in for a running trainer: a real one (the tiny run below) can finish
    # before a second process has imported torch, and the second is then refused for another reason (out exists).
    lock = ref.with_name("run.json.lock")
    lock.parent.mkdir(parents=True)
    lock.write_text(f"{os.getpid()}\n")
    r = subprocess.run([sys.executable, "-m", "transformer_lab", *_argv(text, ref, resume=False)],
                       capture_output=True, text=True, env=ENV)
    assert r.returncode == 2 and "being written by another trainer" in r.stderr, r.stderr
    assert "Traceback" not in r.stderr and lock.read_text() == f"{os.getpid()}\n" and not ref.exists()
    lock.unlink()
    proc = _start(_argv(text, ref, resume=False))
    _, err = proc.communicate()
    assert proc.returncode == 0, err
    reference = json.loads(ref.read_text())

    out = tmp_path / "crash" / "run.json"
    rng = random.Random(2024)
    kills, steps, took_over = 0, [], 0
    plan = ["save:2", "save:3", "random", "random", "random"]  # kills inside saves
    for what in plan:
        resume = out.exists()
        if what.startswith("save:"):
            proc = _start(_argv(text, out, resume=resume), die_in_save=int(what[5:]))
            _, err = proc.communicate()
        else:
            proc = _start(_argv(text, out, resume=resume))
            evals = rng.randint(1, 4)  # let it print this many "step N:" lines (evaluations, saves), then
            while evals and (line := proc.stdout.readline()):
                evals -= line.startswith("step")
            time.sleep(rng.uniform(0.0, 0.05))  # a moment later: mid-step, mid-evaluation or mid-save
            proc.send_signal(signal.SIGKILL)
            _, err = proc.communicate()
        took_over += "took over the lock" in err
        kills += proc.returncode == -signal.SIGKILL
        assert "Traceback" not in err, err
        step = _last_good(out)
        assert step is None or step % 5 == 0
        done = [s for s in steps if s is not None]
        assert not done or (step is not None and step >= done[-1]), steps  # never lost, never goes back
        steps.append(step)
    assert kills >= 3, (kills, steps)
    proc = _start(_argv(text, out, resume=out.exists()))
    _, err = proc.communicate()
    assert proc.returncode == 0, err
    took_over += "took over the lock" in err
    final = json.loads(out.read_text())
    assert final["history"] == reference["history"]
    assert final["val_loss_full"] == reference["val_loss_full"]
    assert took_over >= 1  # a killed trainer's lock was taken over
    leftovers = sorted(p.name for p in out.parent.iterdir())
    assert leftovers == sorted(["run.json", final["weights"]]), leftovers  # no lock, no temporary, no stale weights
    print(f"crash test: {kills} kills at steps {steps}, {time.perf_counter() - t0:.1f} s")


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_ctrl_c_and_sigterm_end_with_one_line_and_leave_nothing_behind(text, tmp_path, sig):
    out = tmp_path / "run.json"
    proc = _start(_argv(text, out, resume=False))
    evals = 2  # after the second evaluation and save
    while evals and (line := proc.stdout.readline()):
        evals -= line.startswith("step")
    proc.send_signal(sig)
    _, err = proc.communicate()
    if proc.returncode == 0:
        pytest.skip("the run finished before the signal arrived")
    assert proc.returncode == 130, err
    assert err.count("\n") == 1 and err.startswith("interrupted at step"), err
    assert f"the checkpoint {out} at step" in err and "add --resume to continue it" in err
    step = _last_good(out)
    leftovers = sorted(p.name for p in tmp_path.iterdir())
    assert leftovers == sorted(["run.json", json.loads(out.read_text())["weights"]]), leftovers  # no lock, no .tmp
    if sig == signal.SIGINT:
        return  # the rest is the same for both
    proc = _start(_argv(text, out, resume=True))
    said, err = proc.communicate()
    assert proc.returncode == 0 and f"resuming {out} at step {step} " in said, err


# ------------------------------------------------------------------ the lock file, in-process
TINY = ["--n-layer", "1", "--n-head", "2", "--d-model", "16", "--block-size", "16", "--batch-size", "4",
        "--max-iters", "2", "--warmup", "1", "--eval-interval", "2", "--eval-iters", "1", "--quiet", "--no-compile",
        "--threads", "1"]


def test_a_live_lock_refuses_a_second_writer(text, tmp_path, capsys):
    holder = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        lock = tmp_path / "run.json.lock"
        lock.write_text(f"{holder.pid}\n")
        code = cli.main(["train", "--text", str(text), "--out", str(tmp_path / "run.json"), *TINY])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: ") and f"pid {holder.pid}" in err and err.count("\n") == 1
        assert sorted(p.name for p in tmp_path.iterdir()) == ["run.json.lock"]
        assert lock.read_text() == f"{holder.pid}\n"
    finally:
        holder.kill()
        holder.wait()


def test_a_dead_writers_lock_and_temporaries_are_taken_over(text, tmp_path, capsys):
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait()
    (tmp_path / "run.json.lock").write_text(f"{dead.pid}\n")
    (tmp_path / ".run.json.abc123.tmp").write_text("half a JSON")
    (tmp_path / ".run.0123456789abcdef.safetensors.x1.tmp").write_bytes(b"half")
    (tmp_path / ".other.json.q.tmp").write_text("not ours")
    assert cli.main(["train", "--text", str(text), "--out", str(tmp_path / "run.json"), *TINY]) == 0
    assert f"took over the lock {tmp_path / 'run.json.lock'} left by pid {dead.pid}" in capsys.readouterr().err
    names = sorted(p.name for p in tmp_path.iterdir())
    weights = json.loads((tmp_path / "run.json").read_text())["weights"]
    assert names == sorted([".other.json.q.tmp", "run.json", weights])
