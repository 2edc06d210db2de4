"""flake8 plugin: `flake8 --select TD` runs torchdoctor's static rules on each file.

flake8 hands over one file at a time, so the cross-file project index holds that
file's classes only (a subclass of a module defined in another file is not
known). The rules that run are those `[tool.torchdoctor]` in the nearest
pyproject.toml enables (by default: every rule that is on by default); flake8's
own `--select`/`--ignore`/`# noqa` then apply to what is reported.
"""

from __future__ import annotations

import ast
import functools
import os
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from torchdoctor import __version__
from torchdoctor.catalog import catalog
from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.config import Settings, find_config, load_settings
from torchdoctor.check.engine import RunOptions, check_source, rules_for
from torchdoctor.check.torch_pins import PinsFinder, TorchCeiling
from torchdoctor.errors import TorchDoctorError


@functools.cache
def _settings_in(folder: str) -> tuple[Settings, RunOptions]:
    """The settings for files in `folder` (config found walking up) and the enabled rules."""
    entries = catalog()
    try:
        settings = load_settings(find_config(Path(folder)), list(entries))
    except TorchDoctorError:
        settings = load_settings(None, list(entries))  # a broken config: use the defaults
    enabled = settings.enabled_codes(
        ((code, info.default_enabled) for code, info in entries.items() if info.kind == "static"),
        {code: info.group for code, info in entries.items()},
    )
    return settings, RunOptions(enabled=enabled, target_version=settings.target_version)


_PINS = PinsFinder()  # flake8 runs one process per batch of files: each folder read once


@functools.cache
def _ceiling_in(folder: str) -> TorchCeiling | None:
    return _PINS.ceiling_for(os.path.join(folder, "_.py"))


class Flake8Plugin:
    """The `TD` entry point in the `flake8.extension` group."""

    name = "torchdoctor"
    version = __version__

    def __init__(self, tree: ast.AST, filename: str, lines: Sequence[str]) -> None:
        self.tree = tree
        self.filename = filename
        self.lines = lines

    def run(self) -> Iterator[tuple[int, int, str, type[Any]]]:
        source = "".join(self.lines)
        path = Path(self.filename) if self.filename not in ("", "-", "stdin") else Path("stdin.py")
        settings, options = _settings_in(str(path.absolute().parent))
        findings = check_source(
            source,
            str(path),
            rules_for(path, settings, options),
            build_project([source]),
            target_version=options.target_version,
            torch_ceiling=(
                _ceiling_in(str(path.absolute().parent)) if options.target_version is None else None
            ),
            tree=self.tree if isinstance(self.tree, ast.Module) else None,
        )
        for f in findings:
            if f.code == "TD001":
                continue  # flake8 reports syntax errors itself (E999)
            # flake8 columns are 0-based
            yield f.line, f.column - 1, f"{f.code} {f.message}", type(self)
