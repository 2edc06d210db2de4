"""`torchdoctor explain "message"` / `torchdoctor explain -` (a whole traceback on stdin)."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from torchdoctor.errors import UsageError

EXIT_KNOWN = 0
EXIT_UNKNOWN = 1


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "explain",
        help="explain a PyTorch error message or traceback",
        description="Explain a PyTorch error: what it means, the likely causes (most likely "
        "first, with rule codes), and the fix. Needs no torch. Exit code 0 when the error "
        "is known, 1 when it is not.",
    )
    parser.add_argument(
        "message",
        nargs="+",
        help='the error message (quote it), or "-" to read a whole traceback from stdin',
    )
    parser.add_argument("--json", action="store_true", help="print the explanation as JSON")
    parser.set_defaults(func=run)


def _read_text(parts: list[str]) -> str:
    text = sys.stdin.read() if parts == ["-"] else " ".join(parts)
    if not text.strip():
        raise UsageError("no error text given", fix='torchdoctor explain "RuntimeError: ..."')
    return text


def run(args: argparse.Namespace) -> int:
    from torchdoctor.explain.explainer import explain

    explanation = explain(_read_text(args.message))
    if args.json:
        print(json.dumps(explanation.as_dict(), indent=2))
    else:
        print(explanation)
    return EXIT_KNOWN if explanation.known else EXIT_UNKNOWN
