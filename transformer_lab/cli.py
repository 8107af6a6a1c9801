"""The command line: ``python -m transformer_lab check N answers.py`` and the capstone's commands.

``check`` grades a file of exercise answers for chapter N and exits 0 only when every exercise passes.
``train`` trains the mini-GPT (chapter 8) on Shakespeare or on ``--text FILE``, with ``--resume``;
``sample`` generates text from a checkpoint (the shipped one by default); ``bench`` runs the benchmarks.

Every command fails on bad input the same way: exit status 2 and one line ``error: ...`` on stderr saying what
was expected, no traceback, and no file left behind or changed.
"""

from __future__ import annotations

import argparse
import math
import os
import signal
import sys
import threading
from pathlib import Path

MAX_ANSWERS_BYTES = 2**20  # an answers file is a few kB of Python
MAX_TEXT_BYTES = 128 * 2**20  # --text: the character tokenizer holds a Python int per character while encoding
MAX_TOKENS = 1_000_000  # sample --tokens
MAX_SEED = 2**63 - 2
CHECK_HELP = """Grade answers to the exercises of chapter N.

A submission is a Python file (.py), a notebook (.ipynb) or a chapter in MyST Markdown (.md)
that defines one function per exercise of the chapter, named as in the chapter's exercise
cells (chapter 2: stable_softmax, softmax_jacobian_at, ...). It runs in a bubblewrap sandbox
(bwrap: no network, no other files than Python's, nothing of the book's package, its own
scratch folder; a time, memory, output and process limit); each answer is compared with ours
on fixed cases, and a missing, unfinished, hanging or crashing one fails with a message
saying what went wrong. Without bwrap, check refuses to grade unless given --unsafe.
The exit status is 0 only when every exercise passes.

Grade a folder of submissions (one file per student) into one CSV:
    python -m transformer_lab check N submissions/ --csv grades.csv
The exit status is 0 when every submission could be graded (wrong answers included), 1 when
one could not (its process ended, hung or hit a limit: see its messages in the CSV).
Add the hidden cases (other inputs, drawn from your secret key) with --hidden-file KEYFILE
(or --hidden-file - to read the key from standard input): never on the command line.

Get a blank answers file to fill in with:  python -m transformer_lab check N --template
(it writes answers-chN.py, one stub per exercise, and never overwrites a file)."""


class _UsageError(Exception):
    """A bad command line: reported as one ``error:`` line, exit status 2."""


class _Parser(argparse.ArgumentParser):
    def error(self, message):  # argparse prints usage and exits; we want one line and a return value
        raise _UsageError(f"{self.prog}: {message} (see --help)")


def _fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def _check(args: argparse.Namespace) -> int:
    from transformer_lab import grading

    if args.template:
        named = args.template if isinstance(args.template, str) else args.answers
        return _write_template(args.chapter, Path(named or f"answers-ch{args.chapter}.py"))
    if args.answers is None:
        return _fail(f"give the submission to grade, e.g. check {args.chapter} answers.py (write a blank one with "
                     f"check {args.chapter} --template)")
    problem = (_positive("memory_mb", args.memory_mb) or
               (f"--timeout must be a positive number of seconds, got {args.timeout}"
                if not (math.isfinite(args.timeout) and args.timeout > 0) else None) or
               ("--hidden needs a file now: --hidden-file KEYFILE, or --hidden-file - to read the key from standard "
                "input (a key on the command line can be read by other processes)" if args.hidden is not None
                else None))
    if problem:
        return _fail(problem)
    key = None
    if args.hidden_file is not None:
        try:
            key = (sys.stdin.readline() if args.hidden_file == "-" else
                   Path(args.hidden_file).read_text(encoding="utf-8")).strip()
        except (OSError, UnicodeDecodeError) as exc:
            return _fail(f"--hidden-file: cannot read the key: {exc}")
        if not key:
            return _fail("--hidden-file: the key is empty")
    unsafe = not grading.sandbox_available()
    if unsafe:
        if not args.unsafe:
            return _fail("bwrap (bubblewrap) is not installed, so a submission cannot be sandboxed and nothing was "
                         "graded: install it (apt-get install bubblewrap), or pass --unsafe to grade without it")
        print("warning: --unsafe: grading without the sandbox; a submission can read your files and the key, and "
              "change other submissions", file=sys.stderr)
    path = Path(args.answers)
    limits = dict(timeout=args.timeout, memory_mb=args.memory_mb, hidden=key, unsafe=unsafe)
    try:
        if path.is_dir():
            out = Path(args.csv or f"grades-ch{args.chapter}.csv")
            rows = grading.grade_folder(args.chapter, path, out, **limits)
            print(grading.summary(rows))
            print(f"wrote {out}: {len(rows)} rows (student, exercise, passed, message)")
            if rows.ungraded:
                print(f"could not grade {len(rows.ungraded)} submission(s) on every exercise (its process ended, "
                      f"hung or hit a limit; see the CSV): {', '.join(rows.ungraded)}")
                return 1
            return 0
        if path.is_file() and path.stat().st_size > MAX_ANSWERS_BYTES:
            return _fail(f"{path} is {path.stat().st_size:,} bytes; a submission is at most "
                         f"{MAX_ANSWERS_BYTES:,} bytes")
        results = grading.grade(args.chapter, path, **limits)
    except (FileNotFoundError, ValueError, OSError) as exc:
        return _fail(str(exc))
    for r in results:
        print(r)
    passed = sum(r.passed for r in results)
    print(f"chapter {args.chapter}: {passed} of {len(results)} exercises pass")
    return 0 if passed == len(results) else 1


def _export_course(args: argparse.Namespace) -> int:
    from transformer_lab.course import export_course

    try:
        dest = export_course(args.dir, args.chapters)
    except (ValueError, OSError) as exc:
        return _fail(str(exc))
    print(f"wrote the nbgrader course {dest}: {', '.join(sorted(p.name for p in (dest / 'source').iterdir()))} "
          f"in source/, and nbgrader_config.py; next: cd {dest} && nbgrader generate_assignment ASSIGNMENT")
    return 0


def _write_template(chapter: int, path: Path) -> int:
    from transformer_lab.exercises.template import answers_template

    if path.exists():
        return _fail(f"{path} exists; give another file name, e.g. check {chapter} --template NEW.py")
    try:
        text = answers_template(chapter)
        with path.open("x", encoding="utf-8") as f:
            f.write(text)
    except (FileNotFoundError, ValueError, OSError) as exc:
        return _fail(str(exc))
    print(f"wrote {path}: fill in each function, then run python -m transformer_lab check {chapter} {path}")
    return 0


# ------------------------------------------------------------------ the capstone (chapter 8)
SHIPPED = "shakespeare"  # transformer_lab/checkpoints/shakespeare.json


def shipped_checkpoint():
    """The path of the checkpoint that ships with the package."""
    from pathlib import Path

    return Path(__file__).resolve().parent / "checkpoints" / f"{SHIPPED}.json"


def _positive(name: str, value, *, allow_zero: bool = False) -> str | None:
    lo = 0 if allow_zero else 1
    if value is not None and value < lo:
        return f"--{name.replace('_', '-')} must be {'>= 0' if allow_zero else 'a positive integer'}, got {value}"
    return None


def _check_text_file(text: str | None) -> str | None:
    if text is None:
        return None
    path = Path(text)
    if path.is_dir():
        return f"--text: {path} is a directory; give a UTF-8 text file"
    if path.is_file() and path.stat().st_size > MAX_TEXT_BYTES:
        return (f"--text: {path} is {path.stat().st_size:,} bytes; give a UTF-8 text file of at most "
                f"{MAX_TEXT_BYTES:,} bytes")
    return None


def _check_threads(threads: int | None) -> str | None:
    """``--threads``: at least 1 and at most four per core (torch cannot start 100,000 threads; it crashes)."""
    most = 4 * (os.cpu_count() or 1)
    if threads is not None and threads > most:
        return f"--threads must be at most {most} (four per core on this machine), got {threads}"
    return _positive("threads", threads)


def _names_a_folder(option: str, path: str | None, example: str) -> str | None:
    """``''``, ``.``, ``/`` or ``a/..`` name no file: the problem with ``option``, or None."""
    if path is not None and Path(path).name in ("", ".", ".."):
        return f"{option}: {path!r} names a folder, not a file; give a checkpoint file name such as {example}"
    return None


def _check_out(out: str) -> str | None:
    from transformer_lab.checkpoint import json_path

    if problem := _names_a_folder("--out", out, "DIR/mini-gpt.json"):
        return problem
    jpath = json_path(out)
    if Path(out).is_dir() or jpath.is_dir():
        return f"--out: {Path(out) if Path(out).is_dir() else jpath} is a directory; give a checkpoint file name " \
               "such as DIR/mini-gpt.json"
    parent = jpath.parent
    while not parent.exists() and parent != parent.parent:
        parent = parent.parent
    if not parent.is_dir():
        return f"--out: {parent} is a file, not a directory, so {jpath} cannot be created there"
    if not os.access(parent, os.W_OK | os.X_OK):
        return f"--out: the directory {parent} is not writable"
    return None


def _memory_needed(mc, tc) -> tuple[float, int]:
    """(bytes, parameters): a generous estimate of what training ``mc`` with ``tc`` holds in memory at once."""
    d, L, V, T, B, h = mc.d_model, mc.n_layer, mc.vocab_size, tc.block_size, tc.batch_size, mc.n_head
    params = L * (12 * d * d + 13 * d) + (V + T) * d + 2 * d
    weights = 16 * params  # float32 weights, gradients and AdamW's two moments
    activations = 4 * L * B * T * (16 * d + 3 * h * T) + 8 * B * T * V  # per block, attention (B, h, T, T), logits
    eval_batches = 2 * tc.eval_iters * 2 * B * T * 8  # the fixed evaluation batches (int64 x and y, two splits)
    return float(weights + activations + eval_batches), params


def _physical_memory() -> float:
    try:
        return float(os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError):
        return math.inf


def _train(args: argparse.Namespace) -> int:
    import torch

    from transformer_lab import distributed
    from transformer_lab.data import load_corpus
    from transformer_lab.gpt import GPTConfig
    from transformer_lab.train import TrainConfig, check_corpus

    problem = (_check_threads(args.threads) or _check_text_file(args.text) or _check_out(args.out))
    if problem:
        return _fail(problem)
    try:
        warmup = args.warmup if args.warmup is not None else min(TrainConfig.warmup, args.max_iters // 10)
        tc = TrainConfig(max_iters=args.max_iters, batch_size=args.batch_size, block_size=args.block_size,
                         lr=args.lr, min_lr=args.min_lr, warmup=warmup, eval_interval=args.eval_interval,
                         eval_iters=args.eval_iters, seed=args.seed, weight_decay=args.weight_decay,
                         grad_accum=args.grad_accum)
        corpus = load_corpus(args.text)
        check_corpus(corpus, tc)
        mc = GPTConfig(vocab_size=corpus.tokenizer.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                       n_head=args.n_head, d_model=args.d_model, dropout=args.dropout, positions=args.positions)
    except (ValueError, RuntimeError, OSError) as exc:
        return _fail(str(exc))
    need, n_params = _memory_needed(mc, tc)
    if need > _physical_memory():
        return _fail(f"this model ({n_params:,} parameters) and batch would need about {need / 2**30:,.1f} GiB of "
                     f"memory, more than this machine's {_physical_memory() / 2**30:,.1f} GiB; use a smaller "
                     "--d-model, --n-layer, --block-size, --batch-size or --eval-iters")
    if args.threads:
        torch.set_num_threads(args.threads)
    try:  # torchrun's environment (one process without it), the device, the precision, the process group
        world = distributed.world_from_env()
        device = distributed.pick_device(args.device, world)
        precision = distributed.check_precision(args.dtype, device)
        distributed.init(world, device)
    except (ValueError, RuntimeError) as exc:
        return _fail(str(exc))
    if args.compile:  # forced; by default (None) decided once the run is set up, and checked then if it compiles
        args.compile = _can_compile(device, world) and args.compile
    main_thread = threading.current_thread() is threading.main_thread()  # only it may set a signal handler
    previous = signal.signal(signal.SIGTERM, _interrupt) if main_thread else None  # SIGTERM acts as Ctrl-C does
    try:
        return _train_ranked(args, tc, mc, corpus, world, device, precision)
    except KeyboardInterrupt:  # before training began (building, compiling, resuming): the lock is released
        print(f"interrupted before the first step; {_kept(Path(args.out))}", file=sys.stderr)
        return 130
    finally:
        if main_thread:
            signal.signal(signal.SIGTERM, previous)
        distributed.shutdown()


def _interrupt(signum, frame):
    raise KeyboardInterrupt


def _kept(out: Path) -> str:
    """What an interrupted run leaves: the checkpoint's step and how to continue, or that there is none."""
    from transformer_lab import checkpoint as ckpt

    out = ckpt.json_path(out)
    if not _readable(out):
        return "no checkpoint was saved"
    return f"the checkpoint {out} at step {ckpt.read(out)[0]['step']} is kept; add --resume to continue it"


def _can_compile(device, world) -> bool:
    """Whether to compile the training step; if not, one line on stderr (rank 0) saying why."""
    from transformer_lab.train import compile_problem, use_compile_cache

    use_compile_cache()  # before inductor first looks for its cache directory
    problem = compile_problem(device)
    if problem and world.is_main:
        print(f"note: training without torch.compile: {problem}", file=sys.stderr)
    return problem is None


def _train_ranked(args, tc, mc, corpus, world, device, precision) -> int:
    """Take the checkpoint's lock (rank 0 only: it alone writes), then train."""
    from transformer_lab import checkpoint as ckpt
    from transformer_lab import distributed
    from transformer_lab.gpt import GPT
    from transformer_lab.train import Trainer, TrainingDiverged, evaluate_loss

    out = ckpt.json_path(args.out)
    created = []  # directories this run makes for --out, removed again if it fails before writing anything
    parent = out.parent
    while not parent.exists():
        created.append(parent)
        parent = parent.parent
    problem = None
    try:
        lock = ckpt.Lock(out) if world.is_main else None
        if lock is not None:
            out.parent.mkdir(parents=True, exist_ok=True)
            lock.acquire()
    except (OSError, ckpt.CheckpointError) as exc:
        problem = str(exc)
    if not distributed.agree(problem is None, world):  # every rank stops when rank 0 cannot take the lock
        _remove_empty(created)
        return _fail(problem or f"rank {world.rank}: rank 0 could not take the checkpoint's lock (see its error)")
    if lock is None:
        return _train_locked(args, tc, mc, corpus, out, ckpt, GPT, Trainer, TrainingDiverged, evaluate_loss,
                             world=world, device=device, precision=precision)
    try:
        if lock.took_over is not None:
            print(f"note: took over the lock {lock.path} left by pid {lock.took_over}, which is no longer running",
                  file=sys.stderr)
        return _train_locked(args, tc, mc, corpus, out, ckpt, GPT, Trainer, TrainingDiverged, evaluate_loss,
                             world=world, device=device, precision=precision)
    finally:
        lock.release()
        _remove_empty(created)


def _remove_empty(dirs: list[Path]) -> None:
    for d in dirs:  # deepest first
        try:
            d.rmdir()
        except OSError:
            return


def _train_locked(args, tc, mc, corpus, out, ckpt, GPT, Trainer, TrainingDiverged, evaluate_loss, *, world,
                  device, precision) -> int:
    import torch

    from transformer_lab import compile_policy as policy
    from transformer_lab.train import use_compile_cache

    torch.manual_seed(tc.seed)
    try:
        model = GPT(mc).to(device)
        trainer = Trainer(model, corpus, tc, checkpoint=out, progress=not args.quiet, precision=precision,
                          world=world)
    except (ValueError, RuntimeError) as exc:
        return _fail(str(exc))
    say = print if world.is_main else _silent  # progress and results from rank 0 only
    if args.resume:
        try:
            trainer.resume(out)
        except ckpt.CheckpointError as exc:
            return _fail(f"cannot resume: {exc}")
        say(f"resuming {out} at step {trainer.step} of {tc.max_iters}")
    elif out.exists() and not args.force:
        return _fail(f"{out} exists; pass --resume to continue it or --force to overwrite it")
    compile_key = _compile_key(mc, tc, args.dtype, device, world)
    cached = policy.is_cached(use_compile_cache(), compile_key)
    if args.compile is None:
        mode, reason = _choose_compile(trainer, tc, device, world, compile_key, cached)
        if mode is not None and not _can_compile(device, world):  # which says why in one line
            mode = None
        elif world.is_main:
            print(f"note: {reason}", file=sys.stderr)
    else:
        mode = args.compile or None
    if mode is not None:
        trainer.compile_(blocks=mode == "blocks")
    say(f"{corpus.name}: {len(corpus.text):,} characters, vocabulary {corpus.tokenizer.vocab_size}, "
        f"sha256 {corpus.sha256[:12]}...; model {model.num_params():,} parameters; {device}, {args.dtype}, "
        f"{world.size} process(es) x {tc.grad_accum} micro-batch(es) of {tc.batch_size} = "
        f"{trainer.global_batch} windows a step")
    try:
        trainer.run()
        with trainer.eagerly():
            val = evaluate_loss(model, corpus.val, block_size=tc.block_size)
        if not math.isfinite(val):
            raise TrainingDiverged(f"the val loss over the whole val split is {val}; the last checkpoint is kept")
        trainer.meta["val_loss_full"] = val  # the final save adds the loss over the whole val split
        trainer.save(weights_only=args.weights_only)
    except TrainingDiverged as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted at step {trainer.step}; {_kept(out)}", file=sys.stderr)
        return 130
    except RuntimeError as exc:
        if world.size == 1:
            raise
        kept = f"; the last checkpoint {out} (step {ckpt.read(out)[0]['step']}) is kept" if _readable(out) else ""
        print(f"error: rank {world.rank} of {world.size}: another process of this torchrun job stopped, so this one "
              f"stops too ({str(exc).splitlines()[0][:160]}){kept}; rerun the same torchrun command with --resume",
              file=sys.stderr)
        return 1
    except (OSError, ckpt.CheckpointError) as exc:
        kept = f"; the last good checkpoint {out} (step {ckpt.read(out)[0]['step']}) is kept" if _readable(out) \
            else ""
        return _fail(f"could not write the checkpoint {out}: {exc}{kept}")
    if world.is_main:
        _record_costs(trainer, compile_key, mode=mode, cached=cached.get(mode, False))
    say(f"done: {tc.max_iters} steps; val loss over the whole val split {val:.4f} nats/char; "
        f"checkpoint {out}")
    return 0


def _compile_key(mc, tc, dtype: str, device, world) -> str:
    """What this run's compiled kernels (and their costs) depend on."""
    import dataclasses

    import torch

    from transformer_lab import compile_policy as policy

    return policy.config_key(model=dataclasses.asdict(mc), batch=tc.batch_size, block=tc.block_size,
                             accum=tc.grad_accum, dtype=dtype, device=device.type, world=world.size,
                             threads=torch.get_num_threads())


def _choose_compile(trainer, tc, device, world, key: str, cached: dict[str, bool]) -> tuple[str | None, str]:
    """The default: eagerly (None), or the compile mode that the steps left repay best
    (:mod:`~transformer_lab.compile_policy`), and one line saying why. Every rank takes the same choice."""
    import torch

    from transformer_lab import compile_policy as policy
    from transformer_lab import distributed
    from transformer_lab.train import use_compile_cache

    x = torch.zeros(tc.batch_size, tc.block_size, dtype=torch.long, device=device)
    eager_s = policy.eager_step_seconds(trainer.loss_of, x, x)
    costs = policy.costs_for(use_compile_cache(), key, eager_s, vector_code=policy.writes_vector_code(device))
    choice = policy.decide(tc.max_iters - trainer.step, eager_s, costs, cached=cached)
    # the same mode on every rank (each agree gives every rank the same answer, so all stop at the same mode)
    mode = next((m for m in policy.MODES if distributed.agree(choice.mode == m, world)), None)
    return mode, choice.reason if mode == choice.mode else "training eagerly: the ranks' measurements disagree"


def _record_costs(trainer, key: str, *, mode: str | None, cached: bool) -> None:
    """Keep this run's measured step times (and a compiled run's start-up) beside the compiled kernels, for the
    next run's choice."""
    from transformer_lab import compile_policy as policy
    from transformer_lab.train import use_compile_cache

    timing = policy.start_up_seconds(trainer.step_seconds)
    if mode is None:
        policy.remember(use_compile_cache(), key, eager_step_s=timing and timing[1])
        return
    start, step = timing or (None, None)
    policy.remember(use_compile_cache(), key, mode, compiled=True, compiled_step_s=step,
                    **{"warm_s" if cached else "cold_s": start})


def _silent(*args, **kwargs) -> None:
    """``print`` on ranks other than 0."""


def _readable(path) -> bool:
    from transformer_lab import checkpoint as ckpt

    try:
        ckpt.read(path)
    except ckpt.CheckpointError:
        return False
    return True


def load_model(path=None, device="cpu"):
    """(model, tokenizer, record) from a checkpoint, the model on ``device``; ``None`` loads the shipped one."""
    import torch

    from transformer_lab import checkpoint as ckpt
    from transformer_lab.data import CharTokenizer
    from transformer_lab.gpt import GPT, GPTConfig

    path = shipped_checkpoint() if path is None else path
    record, tensors = ckpt.read(path)
    try:
        config = GPTConfig(**record["config"])
    except (TypeError, ValueError) as exc:
        raise ckpt.CheckpointError(f"{path} holds an invalid model config: {exc}") from exc
    vocab = record.get("vocab")
    try:
        tok = CharTokenizer(vocab) if isinstance(vocab, str) else None
    except ValueError:
        tok = None
    if tok is None or tok.vocab_size != config.vocab_size:
        raise ckpt.CheckpointError(f"{path}: 'vocab' must be the tokenizer's {config.vocab_size} characters, sorted "
                                   f"and unique, as one string; got {str(vocab)[:40]!r}")
    n_model = sum(k.startswith("model.") for k in tensors)
    if config.n_layer > n_model:  # each block holds tensors: the config cannot be right
        raise ckpt.CheckpointError(f"{path}: its config asks for {config.n_layer} layers but it holds only "
                                   f"{n_model} tensors")
    with torch.device("meta"):  # shapes only: a config asking for a huge model allocates nothing here
        want = ckpt.expected_shapes(GPT(config))
    ckpt.check_model_state(want, tensors, source=str(path))
    model = GPT(config).to(device)
    ckpt.load_model_state(model, tensors, source=str(path))
    model.eval()
    return model, tok, record


def _sample(args: argparse.Namespace) -> int:
    import torch

    from transformer_lab import distributed
    from transformer_lab.checkpoint import CheckpointError

    if not 0 <= args.tokens <= MAX_TOKENS:
        return _fail(f"--tokens must be an integer from 0 to {MAX_TOKENS:,}, got {args.tokens}")
    if not args.greedy and not (math.isfinite(args.temperature) and args.temperature > 0):
        return _fail(f"--temperature must be a finite number > 0, got {args.temperature} (for argmax decoding "
                     "use --greedy)")
    if args.top_k is not None and args.top_k < 1:
        return _fail(f"--top-k must be an integer >= 1, got {args.top_k}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        return _fail(f"--top-p must be a number in (0, 1], got {args.top_p}")
    if not 0 <= args.seed <= MAX_SEED:
        return _fail(f"--seed must be an integer from 0 to 2**63 - 2, got {args.seed}")
    if not args.prompt:
        return _fail("--prompt must hold at least one character")
    if problem := _names_a_folder("--checkpoint", args.checkpoint, "NAME.json"):
        return _fail(problem)
    try:
        device = distributed.pick_device(args.device)
        model, tok, _ = load_model(args.checkpoint, device)
        prompt = tok.encode(args.prompt).view(1, -1).to(device)
        g = torch.Generator(device).manual_seed(args.seed)  # the same seed draws other tokens on another device
    except (CheckpointError, ValueError, OSError) as exc:
        return _fail(str(exc))
    print(args.prompt, end="", flush=True)  # then each character as soon as it is drawn
    drawn = 0

    def show(token):
        nonlocal drawn
        drawn += 1
        print(tok.decode(token), end="", flush=True)

    try:
        model.generate(prompt, args.tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                       greedy=args.greedy, generator=g, on_token=show)
    except KeyboardInterrupt:
        print(f"\ninterrupted after {drawn} of {args.tokens} characters", file=sys.stderr)
        return 130
    except ValueError as exc:
        print()
        return _fail(str(exc))
    print()
    return 0


BENCHMARKS = ("kernels", "components", "swap", "train_speed", "compile_startup", "compile_costs", "generate_speed",
              "recipe", "profile_step", "allreduce", "redraw")  # in benchmarks/


def benchmark_results(directory=None) -> list[tuple[str, str, float, str]]:
    """The quoted ratio of each benchmark that saved one, in :data:`BENCHMARKS` order: ``(name, what the ratio
    compares, the ratio, the machine)``, read from ``directory`` (default ``benchmarks/results``), ``NAME.json``."""
    import json
    from pathlib import Path

    directory = Path(__file__).resolve().parent.parent / "benchmarks" / "results" if directory is None else directory
    rows = []
    for name in BENCHMARKS:
        path = Path(directory) / f"{name}.json"
        if path.is_file():
            result = json.loads(path.read_text(encoding="utf-8"))
            first, m = result["rows"][0], result["machine"]
            kernels = f", {m['kernels']} kernels" if m.get("kernels") else ""  # older result files do not say
            rows.append((name, first["compares"], first["ratio"], f"{m['cpus']} CPUs{kernels}, torch {m['torch']}"))
    return rows


def _bench(args: argparse.Namespace) -> int:
    import runpy
    from pathlib import Path

    root = Path(__file__).resolve().parent.parent / "benchmarks"
    names = BENCHMARKS if args.which == "all" else [args.which]
    for name in names:
        script = root / f"{name}.py"
        if not script.is_file():
            print(f"error: {script} not found (benchmarks live in the repository, not the installed package)",
                  file=sys.stderr)
            return 2
        saved, error = sys.argv, argparse.ArgumentParser.error
        sys.argv = [str(script), *args.args]

        def bad_args(parser, message, name=name):
            raise _UsageError(f"bench {name}: {message} (see python -m transformer_lab bench {name} -- --help)")

        argparse.ArgumentParser.error = bad_args  # the script's own argument errors: one line, exit 2
        try:
            runpy.run_path(str(script), run_name="__main__")
        except _UsageError as exc:
            return _fail(str(exc))
        except SystemExit as exc:
            if exc.code not in (0, None):
                return _fail(f"bench {name} stopped with status {exc.code}")
        except (ValueError, RuntimeError, OSError) as exc:
            return _fail(f"bench {name}: {exc}")
        finally:
            sys.argv, argparse.ArgumentParser.error = saved, error
    return 0


def _ladder(args: argparse.Namespace) -> int:
    import torch

    from transformer_lab import ladder
    from transformer_lab.checkpoint import json_path
    from transformer_lab.data import load_corpus

    problem = _positive("max_iters", args.max_iters) or _check_threads(args.threads) or _check_out(args.out)
    if not problem and json_path(args.out).exists() and not args.force:
        problem = (f"--out: {json_path(args.out)} exists (by default the table that ships with the package); pass "
                   "--force to replace it, or --out NEW.json")
    if problem:
        return _fail(problem)
    torch.set_num_threads(args.threads)
    config = ladder.LadderConfig(max_iters=args.max_iters)
    report = None if args.quiet else (lambda r: print(f"{r['name']:<11} val loss {r['val_loss']:.4f} "
                                                      f"({r['cpu_seconds']:.1f} s of CPU)", flush=True))
    table = ladder.run_ladder(load_corpus(), config, report=report)
    try:
        out = ladder.save_table(table, json_path(args.out))
    except OSError as exc:
        return _fail(f"could not write {json_path(args.out)}: {exc}")
    print(ladder.format_table(table))
    print(f"{config.max_iters} steps per rung; table written to {out}")
    return 0


def _inspect(args: argparse.Namespace) -> int:
    from transformer_lab.checkpoint import CheckpointError
    from transformer_lab.lens import format_reading, read

    if args.top < 1:
        return _fail(f"--top must be an integer >= 1, got {args.top}")
    if problem := _names_a_folder("--checkpoint", args.checkpoint, "NAME.json"):
        return _fail(problem)
    try:
        model, tok, _ = load_model(args.checkpoint)
        reading = read(model, tok, args.prompt)
    except (CheckpointError, ValueError, OSError) as exc:
        return _fail(f"--prompt: {exc}" if isinstance(exc, ValueError) and not isinstance(exc, CheckpointError)
                     else str(exc))
    T = len(args.prompt)
    if not -T <= args.position < T:
        return _fail(f"--position must lie in {-T}..{T - 1} for this {T}-character prompt, got {args.position}")
    print(format_reading(reading, position=args.position, top=args.top))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(prog="python -m transformer_lab",
                     description="Transformer Math Lab: grade exercise answers (check), and train, sample and "
                                 "benchmark the chapter 8 mini-GPT (train, sample, bench).")
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="grade a file of exercise answers for one chapter",
                       formatter_class=argparse.RawDescriptionHelpFormatter, description=CHECK_HELP)
    p.add_argument("chapter", type=int, help="chapter number, 1-8")
    p.add_argument("answers", nargs="?",
                   help="the submission to grade (.py, .ipynb or .md), or a folder of them; with --template, the "
                        "file to write (default answers-chN.py)")
    p.add_argument("--template", nargs="?", const=True, default=False, metavar="FILE",
                   help="write a blank answers file (one stub per exercise) instead of grading, to FILE or the "
                        "ANSWERS path (check N --template FILE, or check N FILE --template); never overwrites")
    p.add_argument("--timeout", type=float, default=10.0,
                   help="seconds the student's code may take per exercise (default 10)")
    p.add_argument("--memory-mb", type=int, default=4096,
                   help="memory limit of the student's process, in MiB (default 4096)")
    p.add_argument("--hidden-file", metavar="KEYFILE", default=None,
                   help="also grade on the hidden cases drawn from the key in KEYFILE, your secret, or read from "
                        "standard input with - (default: public cases only)")
    p.add_argument("--hidden", default=None, help=argparse.SUPPRESS)  # the key on the command line: refused
    p.add_argument("--unsafe", action="store_true",
                   help="grade without the bubblewrap sandbox when bwrap is missing (a submission can then read "
                        "your files)")
    p.add_argument("--csv", default=None,
                   help="for a folder: the CSV to write (default grades-chN.csv in the current folder)")
    p.set_defaults(func=_check)

    p = sub.add_parser("export-course", help="write an nbgrader course: one assignment per chapter, with solution "
                                             "regions and autograded test cells")
    p.add_argument("dir", type=Path, help="the course folder to write (created if missing)")
    p.add_argument("--chapters", type=int, nargs="+", metavar="N", default=None,
                   help="the chapters to export (default: all)")
    p.set_defaults(func=_export_course)

    from transformer_lab.distributed import DEVICES, PRECISIONS
    from transformer_lab.gpt import POSITIONS, GPTConfig
    from transformer_lab.train import TrainConfig

    m, t = GPTConfig(), TrainConfig()
    p = sub.add_parser("train", help="train the mini-GPT (chapter 8)")
    p.add_argument("--text", help="a UTF-8 text file to train on instead of the Shakespeare corpus")
    p.add_argument("--out", default="checkpoints/mini-gpt.json", help="checkpoint path (NAME.json)")
    p.add_argument("--resume", action="store_true", help="continue the run saved at --out")
    p.add_argument("--force", action="store_true", help="overwrite an existing checkpoint at --out")
    p.add_argument("--weights-only", action="store_true", help="finish with a small weights-only checkpoint")
    p.add_argument("--quiet", action="store_true", help="no progress bar")
    p.add_argument("--compile", nargs="?", const="whole", choices=("whole", "blocks"), default=None,
                   metavar="{whole,blocks}",
                   help="fuse the training step with torch.compile (needs a working C++ compiler on a CPU); by "
                        "default only when the run's steps repay the compile's start-up, and then the blocks alone "
                        "(a short compile) or the whole step with its loss (a longer one), whichever saves more; "
                        "one line says which and why; --compile compiles the whole step, --compile blocks the "
                        "blocks alone")
    p.add_argument("--no-compile", dest="compile", action="store_const", const=False, help="never compile")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; fix it for bit-identical reruns)")
    for name, default in (("n_layer", m.n_layer), ("n_head", m.n_head), ("d_model", m.d_model),
                          ("dropout", m.dropout), ("max_iters", t.max_iters), ("batch_size", t.batch_size),
                          ("block_size", t.block_size), ("lr", t.lr), ("min_lr", t.min_lr),
                          ("weight_decay", t.weight_decay),
                          ("eval_interval", t.eval_interval), ("eval_iters", t.eval_iters), ("seed", t.seed)):
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=type(default), default=default,
                       help=f"(default {default})")
    p.add_argument("--warmup", type=int, default=None,
                   help=f"linear warm-up steps, fewer than --max-iters (default {t.warmup}, or a tenth of "
                        f"--max-iters when that is smaller: --max-iters 10 warms up for 1 step)")
    p.add_argument("--positions", choices=POSITIONS, default=m.positions)
    p.add_argument("--grad-accum", type=int, default=t.grad_accum,
                   help="micro-batches of --batch-size summed into one step: a K times larger batch in the memory "
                        f"of one (default {t.grad_accum})")
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="where to train: auto picks cuda, then mps, then cpu (default auto); under torchrun, "
                        "GPU LOCAL_RANK")
    p.add_argument("--dtype", choices=PRECISIONS, default="float32",
                   help="the forward's precision under torch.autocast (weights stay float32; float16 adds a "
                        "gradient scaler) (default float32)")
    p.set_defaults(func=_train)

    p = sub.add_parser("sample", help="generate text from a checkpoint (default: the shipped one)")
    p.add_argument("--checkpoint", help="checkpoint NAME.json to sample from (default: the shipped Shakespeare "
                                        "model, transformer_lab/checkpoints/shakespeare.json)")
    p.add_argument("--prompt", default="ROMEO:\n", help="the text the sample continues (default %(default)r)")
    p.add_argument("--tokens", type=int, default=500,
                   help=f"how many characters to generate, 0 to {MAX_TOKENS:,} (default %(default)s)")
    p.add_argument("--temperature", type=float, default=0.8,
                   help="divide the logits by this number > 0 before sampling: below 1 sharper, above 1 flatter "
                        "(default %(default)s)")
    p.add_argument("--top-k", type=int, default=None,
                   help="sample only from the k most probable characters, k >= 1 (default: all of them)")
    p.add_argument("--top-p", type=float, default=None,
                   help="sample only from the fewest most probable characters whose probabilities add up to at "
                        "least p, 0 < p <= 1 (default: no cut-off)")
    p.add_argument("--greedy", action="store_true",
                   help="take the most probable character at every step instead of sampling; --temperature, "
                        "--top-k, --top-p and --seed then do not matter (default: off)")
    p.add_argument("--seed", type=int, default=0,
                   help="seed of the sampling generator: the same seed and options give the same text "
                        "(default %(default)s)")
    p.add_argument("--device", choices=DEVICES, default="auto",
                   help="where to run the model: auto picks cuda, then mps, then cpu (default auto)")
    p.set_defaults(func=_sample)

    p = sub.add_parser("bench", help="run the capstone's benchmarks (ratios measured in one run)")
    p.add_argument("which", nargs="?", default="all", choices=["all", *BENCHMARKS])
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed on to the benchmark script")
    p.set_defaults(func=_bench)

    from transformer_lab.ladder import FULL, TABLE

    p = sub.add_parser("ladder", help="train the build-up ladder's rungs with the full budget and write the table")
    p.add_argument("--out", default=str(TABLE), help="the table's JSON file (default: the one shipped in the package)")
    p.add_argument("--max-iters", type=int, default=FULL.max_iters,
                   help="optimizer steps per rung (default %(default)s, the full budget)")
    p.add_argument("--force", action="store_true", help="replace the table at --out if it exists")
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads (default 1: reproducible numbers)")
    p.add_argument("--quiet", action="store_true", help="no line per rung while training")
    p.set_defaults(func=_ladder)

    p = sub.add_parser("inspect", help="read a prompt through a model: residual norms, attention, logit lens")
    p.add_argument("--prompt", default="ROMEO:\n", help="the text to read (at most the model's context length)")
    p.add_argument("--checkpoint", help="checkpoint NAME.json (default: the shipped Shakespeare model)")
    p.add_argument("--position", type=int, default=-1,
                   help="the query position shown, 0-based; negative counts from the end (default: the last)")
    p.add_argument("--top", type=int, default=5, help="next characters shown per layer (default %(default)s)")
    p.set_defaults(func=_inspect)
    return parser


def main(argv: list[str] | None = None) -> int:
    try:
        args = build_parser().parse_args(argv)
    except _UsageError as exc:
        return _fail(str(exc))
    return args.func(args)
