"""The command line: ``python -m transformer_lab check N answers.py`` and the capstone's commands.

``check`` grades a file of exercise answers for chapter N and exits 0 only when every exercise passes.
``train`` trains the mini-GPT (chapter 8) on Shakespeare or on ``--text FILE``, with ``--resume``;
``sample`` generates text from a checkpoint (the shipped one by default); ``bench`` runs the benchmarks.
"""

from __future__ import annotations

import argparse
import sys


def _check(args: argparse.Namespace) -> int:
    from transformer_lab.exercises import check_file

    try:
        results = check_file(args.chapter, args.answers)
    except (FileNotFoundError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    for r in results:
        print(r)
    passed = sum(r.passed for r in results)
    print(f"chapter {args.chapter}: {passed} of {len(results)} exercises pass")
    return 0 if passed == len(results) else 1


# ------------------------------------------------------------------ the capstone (chapter 8)
SHIPPED = "shakespeare"  # transformer_lab/checkpoints/shakespeare.json


def shipped_checkpoint():
    """The path of the checkpoint that ships with the package."""
    from pathlib import Path

    return Path(__file__).resolve().parent / "checkpoints" / f"{SHIPPED}.json"


def _train(args: argparse.Namespace) -> int:
    import torch

    from transformer_lab import checkpoint as ckpt
    from transformer_lab.data import load_corpus
    from transformer_lab.gpt import GPT, GPTConfig
    from transformer_lab.train import TrainConfig, Trainer, TrainingDiverged, evaluate_loss

    if args.threads:
        torch.set_num_threads(args.threads)
    try:
        corpus = load_corpus(args.text)
        tc = TrainConfig(max_iters=args.max_iters, batch_size=args.batch_size, block_size=args.block_size,
                         lr=args.lr, min_lr=args.min_lr, warmup=args.warmup, eval_interval=args.eval_interval,
                         eval_iters=args.eval_iters, seed=args.seed, weight_decay=args.weight_decay)
        mc = GPTConfig(vocab_size=corpus.tokenizer.vocab_size, block_size=args.block_size, n_layer=args.n_layer,
                       n_head=args.n_head, d_model=args.d_model, dropout=args.dropout, positions=args.positions)
    except (ValueError, RuntimeError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    torch.manual_seed(tc.seed)
    model = GPT(mc)
    out = args.out
    trainer = Trainer(model, corpus, tc, checkpoint=out, progress=not args.quiet, compile=args.compile)
    if args.resume:
        try:
            trainer.resume(out)
        except ckpt.CheckpointError as exc:
            print(f"error: cannot resume: {exc}", file=sys.stderr)
            return 2
        print(f"resuming {ckpt.json_path(out)} at step {trainer.step} of {tc.max_iters}")
    elif ckpt.json_path(out).exists() and not args.force:
        print(f"error: {ckpt.json_path(out)} exists; pass --resume to continue it or --force to overwrite it",
              file=sys.stderr)
        return 2
    print(f"{corpus.name}: {len(corpus.text):,} characters, vocabulary {corpus.tokenizer.vocab_size}, "
          f"sha256 {corpus.sha256[:12]}...; model {model.num_params():,} parameters")
    try:
        trainer.run()
    except TrainingDiverged as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    val = evaluate_loss(model, corpus.val, block_size=tc.block_size)
    trainer.meta["val_loss_full"] = val  # the final save adds the loss over the whole val split
    trainer.save(weights_only=args.weights_only)
    print(f"done: {tc.max_iters} steps; val loss over the whole val split {val:.4f} nats/char; "
          f"checkpoint {ckpt.json_path(out)}")
    return 0


def load_model(path=None):
    """(model, tokenizer, record) from a checkpoint; ``None`` loads the shipped one."""
    from transformer_lab import checkpoint as ckpt
    from transformer_lab.data import CharTokenizer
    from transformer_lab.gpt import GPT, GPTConfig

    path = shipped_checkpoint() if path is None else path
    record, tensors = ckpt.read(path)
    try:
        config = GPTConfig(**record["config"])
    except (TypeError, ValueError) as exc:
        raise ckpt.CheckpointError(f"{path} holds an invalid model config: {exc}") from exc
    model = GPT(config)
    ckpt.load_model_state(model, tensors, source=str(path))
    model.eval()
    return model, CharTokenizer(record["vocab"]), record


def _sample(args: argparse.Namespace) -> int:
    import torch

    from transformer_lab.checkpoint import CheckpointError

    try:
        model, tok, _ = load_model(args.checkpoint)
        prompt = tok.encode(args.prompt).view(1, -1)
        g = torch.Generator().manual_seed(args.seed)
        out = model.generate(prompt, args.tokens, temperature=args.temperature, top_k=args.top_k,
                             top_p=args.top_p, greedy=args.greedy, generator=g)
    except (CheckpointError, ValueError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(tok.decode(out[0]))
    return 0


BENCHMARKS = ("kernels", "train_speed", "generate_speed", "recipe", "profile_step")  # scripts in benchmarks/


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
        saved = sys.argv
        sys.argv = [str(script), *args.args]
        try:
            runpy.run_path(str(script), run_name="__main__")
        finally:
            sys.argv = saved
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m transformer_lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="grade a file of exercise answers for one chapter")
    p.add_argument("chapter", type=int, help="chapter number, 1-8")
    p.add_argument("answers", help="a .py file defining the exercise functions")
    p.set_defaults(func=_check)

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
    p.add_argument("--compile", action="store_true",
                   help="fuse the training step with torch.compile (faster after a compile of ~10-30 s)")
    p.add_argument("--threads", type=int, default=None,
                   help="torch CPU threads (default: torch's choice; fix it for bit-identical reruns)")
    for name, default in (("n_layer", m.n_layer), ("n_head", m.n_head), ("d_model", m.d_model),
                          ("dropout", m.dropout), ("max_iters", t.max_iters), ("batch_size", t.batch_size),
                          ("block_size", t.block_size), ("lr", t.lr), ("min_lr", t.min_lr),
                          ("warmup", t.warmup), ("weight_decay", t.weight_decay),
                          ("eval_interval", t.eval_interval), ("eval_iters", t.eval_iters), ("seed", t.seed)):
        p.add_argument("--" + name.replace("_", "-"), dest=name, type=type(default), default=default,
                       help=f"(default {default})")
    p.add_argument("--positions", choices=POSITIONS, default=m.positions)
    p.set_defaults(func=_train)

    p = sub.add_parser("sample", help="generate text from a checkpoint (default: the shipped one)")
    p.add_argument("--checkpoint", help="checkpoint NAME.json (default: the shipped Shakespeare model)")
    p.add_argument("--prompt", default="ROMEO:\n")
    p.add_argument("--tokens", type=int, default=500)
    p.add_argument("--temperature", type=float, default=0.8)
    p.add_argument("--top-k", type=int, default=None)
    p.add_argument("--top-p", type=float, default=None)
    p.add_argument("--greedy", action="store_true")
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=_sample)

    p = sub.add_parser("bench", help="run the capstone's benchmarks (ratios measured in one run)")
    p.add_argument("which", nargs="?", default="all", choices=["all", *BENCHMARKS])
    p.add_argument("args", nargs=argparse.REMAINDER, help="arguments passed on to the benchmark script")
    p.set_defaults(func=_bench)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
