"""The command line: ``python -m transformer_lab check N answers.py`` (and the capstone's commands).

``check`` grades a file of exercise answers for chapter N and exits 0 only when every exercise passes.
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


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m transformer_lab", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("check", help="grade a file of exercise answers for one chapter")
    p.add_argument("chapter", type=int, help="chapter number, 1-8")
    p.add_argument("answers", help="a .py file defining the exercise functions")
    p.set_defaults(func=_check)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    return args.func(args)
