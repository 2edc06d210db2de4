"""`torchdoctor run script.py [args...]` / `torchdoctor run -m module [args...]`.

Adding an option that wraps the program (e.g. a simulated device): add the
argument in `add_options` and turn it into a context manager in
`build_contexts`; `run` enters those contexts around the program in order.
Importing this module does not import torch.
"""

from __future__ import annotations

import argparse
import os
from contextlib import AbstractContextManager
from typing import Any

from torchdoctor.errors import UsageError
from torchdoctor.runtime import simulate_cli


def register(subparsers: Any) -> None:
    parser = subparsers.add_parser(
        "run",
        help="run a script like python, explaining errors and guarding models",
        description="Run a Python script (or -m module) exactly like `python` would — same "
        "sys.argv, __main__ and exit code — with the explainer installed (an uncaught "
        "error prints its traceback, then the explanation) and the guard's checks on for "
        "the first steps of every model and optimizer.",
        usage="torchdoctor run [options] (script.py | -m module) [args ...]",
    )
    add_options(parser)
    # like `python -m`: everything after the module name is the module's own arguments
    parser.add_argument(
        "-m",
        dest="module",
        nargs=argparse.REMAINDER,
        metavar="MODULE [args]",
        help="run a module as a script",
    )
    parser.add_argument(
        "program",
        nargs=argparse.REMAINDER,
        help="the script and its arguments (or arguments of -m)",
    )
    parser.set_defaults(func=run)


def add_options(parser: argparse.ArgumentParser) -> None:
    """The options that change how the program runs."""
    parser.add_argument(
        "--no-guard", action="store_true", help="do not install the guard's runtime checks"
    )
    parser.add_argument(
        "--guard-steps",
        type=int,
        default=None,
        metavar="N",
        help="keep the guard's checks on for the first N steps (default 100)",
    )
    parser.add_argument(
        "--detect-nonfinite",
        action="store_true",
        help="stop at the first NaN/Inf in any model's forward or backward and name the "
        "module, operation and step where it came from (TD217)",
    )
    simulate_cli.add_options(parser)


def build_contexts(args: argparse.Namespace) -> list[AbstractContextManager[Any]]:
    """Context managers to enter around the program, from the options above."""
    contexts = [*simulate_cli.contexts(args)]
    if getattr(args, "detect_nonfinite", False):
        from torchdoctor._torch import require_torch

        require_torch("torchdoctor run --detect-nonfinite")
        from torchdoctor.runtime.nonfinite import watching

        contexts.append(watching())
    return contexts


def run(args: argparse.Namespace) -> int:
    from torchdoctor.runtime.run import run_module, run_script

    if args.guard_steps is not None and args.guard_steps < 1:
        raise UsageError(f"--guard-steps must be at least 1, not {args.guard_steps}")
    program = list(args.program)
    if program and program[0] == "--":
        program = program[1:]
    if args.simulate and _is_torchrun(program, args.module):
        return _launch(args, program)
    options: dict[str, Any] = {
        "contexts": build_contexts(args),
        "guard": not args.no_guard,
        "guard_steps": args.guard_steps,
    }
    if args.module is not None:
        if not args.module:
            raise UsageError("-m needs a module name", fix="torchdoctor run -m package.module")
        module, *module_args = args.module
        return simulate_cli.exit_code(args, run_module(module, module_args, **options))
    if not program:
        raise UsageError("nothing to run", fix="torchdoctor run script.py [args ...]")
    return simulate_cli.exit_code(args, run_script(program[0], program[1:], **options))


def _launch(args: argparse.Namespace, program: list[str]) -> int:
    """`--simulate cuda:N -- torchrun ...`: every worker runs under `torchdoctor run`."""
    backend, devices = simulate_cli.split_simulate(args)
    options = ["--simulate", f"{backend}:{devices or 1}"]
    for flag, on in (
        ("--no-guard", args.no_guard),
        ("--keep-going", args.keep_going),
        ("--strict-load", args.strict_load),
        ("--cpu-autocast", args.cpu_autocast),
        ("--detect-nonfinite", args.detect_nonfinite),
    ):
        if on:
            options.append(flag)
    if args.guard_steps is not None:
        options += ["--guard-steps", str(args.guard_steps)]
    torchrun_args = program if args.module else program[1:]
    from torchdoctor._torch import require_torch

    require_torch("torchdoctor run --simulate")
    from torchdoctor.runtime.sim import ranks

    return ranks.launch(torchrun_args, options)


def _is_torchrun(program: list[str], module: str | None) -> bool:
    """`torchrun ...` or `-m torch.distributed.run ...` (kept in step with sim/ranks.py)."""
    if module == "torch.distributed.run":
        return True
    return bool(program) and os.path.basename(program[0]) == "torchrun"
