"""`train` compiles its training step when the run's steps repay the compile's start-up (one line says which and
why), falls back to eager with one line saying why when it cannot compile, --compile and --no-compile force either
(issues 18 and 29). torch.compile itself is replaced by a recorder here: a real compile takes tens of seconds, and
the compiled step's agreement with the eager one is tested in test_train.py."""

import json
import os

import pytest
import torch

from transformer_lab import cli, compile_policy, train
from transformer_lab.data import Corpus, shakespeare
from transformer_lab.gpt import GPT, GPTConfig

TINY = ["--n-layer", "1", "--n-head", "2", "--d-model", "16", "--block-size", "16", "--batch-size", "4",
        "--max-iters", "4", "--warmup", "1", "--eval-interval", "4", "--eval-iters", "1", "--quiet", "--threads", "1"]


@pytest.fixture
def run(tmp_path, monkeypatch):
    """``run(*flags)`` trains TINY through the CLI; returns (exit code, stderr, how many times torch.compile ran)."""
    (tmp_path / "text.txt").write_text(shakespeare()[:12_000], encoding="utf-8")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "inductor"))
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda model, **kw: compiled.append(model) or model)

    def go(*flags, capsys):
        compiled.clear()
        code = cli.main(["train", "--text", str(tmp_path / "text.txt"), "--out", str(tmp_path / "m.json"),
                         "--force", *TINY, *flags])
        return code, capsys.readouterr().err, len(compiled)

    return go


def _needs_a_compiler():
    if train.compile_problem("cpu") is not None:
        pytest.skip(f"this machine cannot compile: {train.compile_problem('cpu')}")


def _notes(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("note:")]


def test_a_short_default_run_trains_eagerly_and_says_why(run, capsys):
    _needs_a_compiler()
    code, err, n = run(capsys=capsys)
    [note] = _notes(err)
    assert code == 0 and n == 0
    assert note.startswith("note: training eagerly: 4 steps would not repay a compile (the blocks: break-even ") \
        and "empty compile cache" in note and note.endswith("--compile compiles anyway"), note


def test_a_default_run_that_repays_the_start_up_compiles_what_saves_most(run, capsys, monkeypatch):
    _needs_a_compiler()
    cheap, dear = compile_policy.Costs(1e-9, 1e-9, 2.0), compile_policy.Costs(1e9, 1e9, 4.0)
    monkeypatch.setattr(compile_policy, "PRIOR", {"blocks": cheap, "whole": compile_policy.Costs(1e-9, 1e-9, 4.0)})
    code, err, n = run(capsys=capsys)
    [note] = _notes(err)
    assert code == 0 and n == 3  # the forward with its loss, the update, the clipping
    assert note.startswith("note: compiling the whole training step: 4 steps, break-even 1 steps"), note
    monkeypatch.setattr(compile_policy, "PRIOR", {"blocks": cheap, "whole": dear})
    code, err, n = run("--n-layer", "2", capsys=capsys)
    [note] = _notes(err)
    assert code == 0 and n == 4  # each of the two blocks, the update, the clipping
    assert note.startswith("note: compiling the blocks: 4 steps, break-even 1 steps"), note


def test_compile_and_no_compile_force_either(run, capsys, tmp_path):
    _needs_a_compiler()
    code, err, n = run("--compile", capsys=capsys)
    assert code == 0 and n == 3 and not _notes(err)
    code, err, n = run("--compile", "blocks", "--n-layer", "2", capsys=capsys)
    assert code == 0 and n == 4 and not _notes(err)  # each of the two blocks, the update, the clipping
    recorded = json.loads((tmp_path / "inductor" / compile_policy.COSTS_FILE).read_text()).values()
    assert sorted(mode for entry in recorded for mode in compile_policy.MODES if mode in entry) == ["blocks", "whole"]
    code, err, n = run("--no-compile", capsys=capsys)
    assert code == 0 and n == 0 and not _notes(err)
    code, err, n = run("--compile", "all", capsys=capsys)
    assert code == 2 and n == 0 and "invalid choice: 'all' (choose from 'whole', 'blocks')" in err, err


def test_compiled_blocks_evaluate_eagerly(monkeypatch):
    """Evaluation runs without gradients and in eval mode: compiled blocks would compile again for it (and for the
    final evaluation's batch), a cost the policy does not count. Evaluation runs them eagerly instead."""
    graphs = []
    real = torch.compile

    def counting(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    monkeypatch.setattr(torch, "compile", lambda fn=None, **kw: real(fn, backend=counting))
    torch._dynamo.reset()
    corpus = Corpus.from_text(shakespeare()[:20_000], name="excerpt")
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=corpus.tokenizer.vocab_size, block_size=16, n_layer=2, n_head=2, d_model=16))
    trainer = train.Trainer(model, corpus, train.TrainConfig(max_iters=3, batch_size=4, block_size=16, warmup=1,
                                                             eval_interval=100, eval_iters=1), progress=False)
    trainer.compile_(blocks=True)
    trainer.run(until=2)
    compiled = len(graphs)
    trainer.evaluate()
    with trainer.eagerly():  # as `train` evaluates at the end
        train.evaluate_loss(model, corpus.val, block_size=16, max_windows=70)
    trainer.run()
    assert compiled > 0 and len(graphs) == compiled


def test_a_compiled_run_records_its_costs_and_the_next_run_counts_the_cache_warm(run, capsys, tmp_path):
    _needs_a_compiler()
    cache = tmp_path / "inductor"
    (cache / "fxgraph" / "ab").mkdir(parents=True)  # as inductor leaves it (the recorder compiles nothing)
    assert run("--compile", capsys=capsys)[0] == 0
    [entry] = json.loads((cache / compile_policy.COSTS_FILE).read_text()).values()
    entry = entry["whole"]  # --compile compiles the whole step
    assert entry["compiled"] is True and entry["cold_s"] >= 0 and entry["compiled_step_s"] > 0
    code, err, _ = run(capsys=capsys)
    [note] = _notes(err)
    assert code == 0 and "empty compile cache; the whole training step: " in note, note
    assert note.endswith("its kernels cached); --compile compiles anyway"), note


def test_a_resumed_run_counts_only_the_steps_left(run, capsys, monkeypatch):
    _needs_a_compiler()
    whole = train.Trainer.run
    monkeypatch.setattr(train.Trainer, "run", lambda self, **kw: whole(self, until=4))  # stopped at step 4 of 6
    assert run("--no-compile", "--max-iters", "6", "--eval-interval", "2", capsys=capsys)[0] == 0
    monkeypatch.setattr(train.Trainer, "run", whole)
    code, err, n = run("--resume", "--max-iters", "6", "--eval-interval", "2", capsys=capsys)
    [note] = _notes(err)
    assert code == 0 and n == 0 and "training eagerly: 2 steps would not repay" in note, note


@pytest.mark.parametrize("flags", [("--compile",), ()])
def test_without_a_compiler_train_falls_back_with_one_line(run, capsys, monkeypatch, flags):
    """Forced, or chosen by default (here the priors make any compile pay), a compile without a C++ compiler
    trains eagerly and says why in one line."""
    from torch._inductor import cpp_builder
    from torch._inductor.exc import InvalidCxxCompiler

    def missing():
        raise InvalidCxxCompiler

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", missing)
    monkeypatch.setattr(compile_policy, "PRIOR", dict.fromkeys(compile_policy.MODES, compile_policy.Costs(
        1e-9, 1e-9, 2.0)))
    train._cpu_compiler_problem.cache_clear()
    try:
        code, err, n = run(*flags, capsys=capsys)
    finally:
        train._cpu_compiler_problem.cache_clear()
    assert code == 0 and n == 0
    assert _notes(err) == ["note: training without torch.compile: no working C++ compiler for torch.compile's CPU "
                           "backend (InvalidCxxCompiler; set CXX)"]


def test_a_short_default_run_never_checks_the_compiler(run, capsys, monkeypatch):
    """Deciding not to compile costs no compiler check and no check of the vector instructions (each builds test
    libraries: seconds)."""
    from torch._inductor import cpu_vec_isa

    monkeypatch.setattr(train, "compile_problem", lambda device: pytest.fail("the compiler was checked"))
    monkeypatch.setattr(cpu_vec_isa, "pick_vec_isa", lambda: pytest.fail("the vector instructions were checked"))
    code, err, n = run(capsys=capsys)
    assert code == 0 and n == 0 and _notes(err)[0].startswith("note: training eagerly")


def test_the_compile_cache_goes_to_the_users_cache_unless_set(monkeypatch, tmp_path):
    monkeypatch.delenv("TORCHINDUCTOR_CACHE_DIR", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    kernel_set = torch.backends.cpu.get_cpu_capability().lower()
    assert train.use_compile_cache() == tmp_path / "transformer_lab" / "inductor" / kernel_set
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path / "mine"))
    assert train.use_compile_cache() == tmp_path / "mine"


@pytest.mark.timeout(600)
def test_a_run_on_the_other_kernel_set_compiles_beside_the_first_runs_cache(tmp_path):
    """Inductor's caches do not tell PyTorch's CPU kernel sets apart: a kernel written with vector instructions,
    found again by a run on the portable set, fails to compile. The user's cache keeps one folder per set, so a
    compiled run after another on the other set compiles and trains."""
    import subprocess
    import sys

    script = ("import torch; from transformer_lab import train; train.use_compile_cache();"
              "f = torch.compile(lambda x: (x * x).sum(-1).sqrt(), dynamic=False);"
              "print(train.use_compile_cache().name, float(f(torch.ones(4, 64))[0]))")
    env = {k: v for k, v in os.environ.items() if k not in ("TORCHINDUCTOR_CACHE_DIR", "ATEN_CPU_CAPABILITY")}
    env["XDG_CACHE_HOME"] = str(tmp_path)
    outputs = [subprocess.run([sys.executable, "-c", script], env={**env, **extra}, capture_output=True, text=True,
                              timeout=300) for extra in ({}, {"ATEN_CPU_CAPABILITY": "default"})]
    assert [o.returncode for o in outputs] == [0, 0], outputs[-1].stderr[-2000:]
    first, second = (o.stdout.split() for o in outputs)  # first: this CPU's own set (default only without AVX2)
    assert first[1] == "8.0" and second == ["default", "8.0"]


def test_the_gpt_checks_its_input_once_not_in_every_component(monkeypatch):
    """Inside the GPT the components run unchecked (shapes checked at construction and at the entry): a training
    forward and backward never calls their checked public entry points (the same numbers: test_gpt.py)."""
    from transformer_lab import attention, mlp, norm
    from transformer_lab.gpt import GPT, GPTConfig
    from transformer_lab.information import cross_entropy

    def checked(*args, **kwargs):
        raise AssertionError("a checked entry point ran inside the model")

    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=11, block_size=40, n_layer=2, n_head=2, d_model=16, dropout=0.1))
    idx = torch.randint(0, 11, (2, 40))
    for module, name in ((attention, "scaled_dot_product_attention"), (attention, "merge_heads"),
                         (norm, "layer_norm"), (norm.LayerNorm, "forward"), (mlp.MLP, "_check")):
        monkeypatch.setattr(module, name, checked)
    cross_entropy(model(idx), idx).backward()
    with pytest.raises(ValueError, match="token ids must lie in"):  # the entry still checks
        model(idx + 11)
