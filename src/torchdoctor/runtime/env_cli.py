"""`torchdoctor env [--json | --issue]`: print env_report() for humans, programs or bug reports.

Importing this module must not import torch (the CLI loads every command
module to build its help); torch is imported when the command runs.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

EXIT_OK = 0
EXIT_ERROR = 2


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "env",
        help="print Python, torch, CUDA and device facts, with warnings for known mismatches",
        description="Print Python, torch, CUDA/cuDNN/ROCm versions, each device with its "
        "capability and memory, MPS/XPU availability, distributed environment variables, "
        "and warnings for known mismatches (e.g. a GPU the installed wheel has no kernels for).",
    )
    form = parser.add_mutually_exclusive_group()
    form.add_argument("--json", action="store_true", help="print JSON")
    form.add_argument(
        "--issue",
        action="store_true",
        help="print a Markdown block to paste into a bug report: PyTorch's own "
        "`python -m torch.utils.collect_env` output plus torchdoctor's checks",
    )
    parser.add_argument(
        "--no-free-memory",
        dest="free_memory",
        action="store_false",
        help="do not query free GPU memory (that creates a CUDA context on every GPU)",
    )
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    try:
        from torchdoctor.runtime.env import (
            collect_env_text,
            env_report,
            format_issue,
            format_report,
        )
    except ImportError as exc:
        if (exc.name or "").split(".")[0] != "torch":
            raise
        print(
            "torchdoctor: error: `torchdoctor env` needs PyTorch, which is not installed "
            "(pip install 'torchdoctor[runtime]')",
            file=sys.stderr,
        )
        return EXIT_ERROR
    report = env_report(free_memory=args.free_memory)
    if args.json:
        print(json.dumps(report, indent=2, default=str))
    elif args.issue:
        print(format_issue(report, collect_env_text()))
    else:
        print(format_report(report))
    return EXIT_OK
