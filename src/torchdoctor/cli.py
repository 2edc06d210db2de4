"""The `torchdoctor` command line: a thin argparse front over the subcommands.

Each subcommand lives beside the code it drives and exposes
`register(subparsers)`, which adds its parser and sets `func(args) -> int`.
Importing these modules must stay cheap and must not import torch.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence
from typing import NoReturn

from torchdoctor import __version__
from torchdoctor.errors import TorchDoctorError

# Order is the order shown in --help.
COMMAND_MODULES: tuple[str, ...] = (
    "torchdoctor.check.commands",
    "torchdoctor.runtime.env_cli",
    "torchdoctor.explain.cli",
    "torchdoctor.runtime.run_cli",
    "torchdoctor.server.cli",
)

EXIT_OK = 0
EXIT_FINDINGS = 1
EXIT_ERROR = 2


class _Parser(argparse.ArgumentParser):
    """argparse that exits with 2 and a one-line message, without the usage block.

    The usage of `check` is some twenty lines; printed before the error, it pushes the
    one line that says what was wrong out of sight. `--help` is named instead.
    """

    def error(self, message: str) -> None:  # type: ignore[override]
        self.exit(EXIT_ERROR, f"torchdoctor: error: {message} (see `{self.prog} --help`)\n")


def build_parser() -> argparse.ArgumentParser:
    parser = _Parser(
        prog="torchdoctor",
        description="Find, prevent and explain the mistakes that make PyTorch code "
        "crash or silently train wrong.",
    )
    parser.add_argument("--version", action="version", version=f"torchdoctor {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=_Parser)
    for name in COMMAND_MODULES:
        importlib.import_module(name).register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    return _run(argv)[0]


def entry() -> NoReturn:
    """The console command: `main`, then the end of the process.

    A command that sets `exits_fast` (check) ends the process at once after flushing
    its output, without freeing its objects one by one: the program model of a large
    project is millions of objects, and tearing them down at exit cost about 3% of a
    check of PyTorch's tree (mypy ends the same way). Nothing of the user's is pending
    then: every write of such a command (fixed files, cache, report) is done and closed.
    """
    code, exits_fast = _run(None)
    if exits_fast:
        _end_now(code)
    raise SystemExit(code)


def _end_now(code: int) -> NoReturn:
    try:
        sys.stdout.flush()
        sys.stderr.flush()
    except BrokenPipeError:  # the reader of our output left (`| head`): not our error
        pass
    os._exit(code)


def _run(argv: Sequence[str] | None) -> tuple[int, bool]:
    """The exit code, and whether the process may end without tearing down."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_ERROR, False
    try:
        return int(args.func(args)), bool(getattr(args, "exits_fast", False))
    except TorchDoctorError as exc:
        print(f"torchdoctor: error: {exc}", file=sys.stderr)
        return EXIT_ERROR, False
    except KeyboardInterrupt:
        return 130, False
    except BrokenPipeError:
        # `torchdoctor check | head`: the reader left; not our error.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FINDINGS, False
    except Exception as exc:  # the last line of defence: never a raw traceback
        if os.environ.get("TORCHDOCTOR_DEBUG"):
            raise
        print(
            f"torchdoctor: internal error: {type(exc).__name__}: {exc}\n"
            "  (set TORCHDOCTOR_DEBUG=1 for the traceback, and please report it)",
            file=sys.stderr,
        )
        return EXIT_ERROR, False


if __name__ == "__main__":
    entry()
