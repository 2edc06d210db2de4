"""`torchdoctor server`: start the Language Server on standard input and output."""

from __future__ import annotations

import argparse

from torchdoctor.errors import UsageError


def register(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = subparsers.add_parser(
        "server",
        help="run the checker as a Language Server (stdio) for editors",
        description="Diagnostics, quick fixes, `# noqa` actions and rule docs on hover for "
        "editors that speak the Language Server Protocol (VS Code, Neovim, Helix, …). "
        "Reads the project's [tool.torchdoctor] configuration like `torchdoctor check`.",
    )
    parser.add_argument(
        "--stdio", action="store_true", help="talk over standard input/output (the default)"
    )
    parser.set_defaults(func=run_server_command)


def run_server_command(args: argparse.Namespace) -> int:
    try:
        from torchdoctor.server.lsp import serve
    except ImportError as exc:
        raise UsageError(
            f"torchdoctor server needs pygls ({exc.name or exc} is missing): "
            "pip install 'torchdoctor[server]'"
        ) from None
    serve()
    return 0
