"""CLI commands of the static checker: `check`, `rules`, `rule CODE`."""

from __future__ import annotations

import argparse
import contextlib
import difflib
import io
import json
import os
import signal
import sys
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any, TextIO

from torchdoctor.catalog import catalog, lookup
from torchdoctor.check import report
from torchdoctor.check.config import (
    Settings,
    did_you_mean,
    find_config,
    load_settings,
    parse_torch_version,
    validate_selectors,
)
from torchdoctor.check.engine import FileResult, RunOptions
from torchdoctor.check.fix import remove_temp_files_in_progress
from torchdoctor.check.notebook import cell_diffs, write_notebook
from torchdoctor.check.parallel import kill_workers, tune_gc
from torchdoctor.check.runner import run_check
from torchdoctor.errors import UsageError


def _jobs(value: str) -> int:
    try:
        jobs = int(value)
    except ValueError:
        jobs = 0
    if jobs < 1:
        raise argparse.ArgumentTypeError(f"expected a number of processes >= 1, got {value!r}")
    return jobs


def register(subparsers: Any) -> None:
    check = subparsers.add_parser(
        "check",
        help="statically check Python files and notebooks (no torch needed)",
        description="Statically check PyTorch code for device, training-loop, loss, "
        "checkpoint and data-loading mistakes. Exit 0: clean; 1: findings; 2: error.",
    )
    check.add_argument(
        "paths", nargs="*", help="files or folders (default: .); `-` reads the standard input"
    )
    rules = check.add_argument_group("rule selection")
    rules.add_argument("--select", help="comma-separated codes or prefixes to enable (TD1,TD402)")
    rules.add_argument("--extend-select", help="codes or prefixes to enable on top")
    rules.add_argument("--ignore", help="codes or prefixes to disable")
    rules.add_argument(
        "--per-file-ignores",
        action="append",
        metavar="GLOB:CODES",
        help="disable codes for matching files, e.g. 'tests/*:TD101,TD402' "
        "(repeatable; replaces the configured table)",
    )
    rules.add_argument("--target-version", help="the torch version the code must run on, e.g. 2.1")
    files = check.add_argument_group("file selection")
    files.add_argument("--exclude", help="comma-separated globs replacing the default excludes")
    files.add_argument("--extend-exclude", help="comma-separated globs to exclude as well")
    files.add_argument(
        "--force-exclude",
        action="store_true",
        default=None,
        help="apply excludes and .gitignore to files named on the command line too "
        "(for pre-commit, which names every changed file)",
    )
    files.add_argument(
        "--no-respect-gitignore",
        dest="respect_gitignore",
        action="store_false",
        default=None,
        help="also check files that git ignores",
    )
    files.add_argument(
        "--stdin-filename",
        type=Path,
        help="the file name of the code read from the standard input (`-`)",
    )
    files.add_argument("--config", type=Path, help="pyproject.toml to use (default: nearest)")
    files.add_argument("--isolated", action="store_true", help="ignore all configuration files")
    output = check.add_argument_group("output")
    output.add_argument(
        "--format",
        default="text",
        choices=sorted(report.FORMATS),
        help="output format (default: text)",
    )
    output.add_argument("-o", "--output-file", type=Path, help="write the report to this file")
    output.add_argument("--statistics", action="store_true", help="count findings by code")
    output.add_argument("--exit-zero", action="store_true", help="exit 0 even with findings")
    fixes = check.add_argument_group("fixes")
    fixes.add_argument("--fix", action="store_true", help="apply safe fixes in place")
    fixes.add_argument(
        "--unsafe-fixes", action="store_true", help="with --fix/--diff, apply unsafe fixes too"
    )
    fixes.add_argument("--diff", action="store_true", help="show fixes as a diff; write nothing")
    fixes.add_argument(
        "--add-noqa",
        action="store_true",
        help="add a noqa comment for every finding (silence today's, catch tomorrow's)",
    )
    speed = check.add_argument_group("speed")
    speed.add_argument(
        "-j",
        "--jobs",
        type=_jobs,
        help="processes to check files with (default: one per core; 1: in this process)",
    )
    speed.add_argument(
        "--no-cache", action="store_true", help="do not read or write .torchdoctor_cache/"
    )
    check.set_defaults(func=run_check_command, exits_fast=True)

    rules_cmd = subparsers.add_parser("rules", help="list every rule code")
    rules_cmd.add_argument("--format", choices=("text", "json"), default="text")
    rules_cmd.add_argument(
        "--all", action="store_true", help="include engine and runtime-only codes"
    )
    rules_cmd.set_defaults(func=run_rules_command)

    rule = subparsers.add_parser("rule", help="show one rule's documentation")
    rule.add_argument("code", help="a rule code (TD402) or name (load-without-map-location)")
    rule.set_defaults(func=run_rule_command)


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()] if value else []


def _settings(args: argparse.Namespace, anchor: Path) -> Settings:
    """Config file settings (found from `anchor`), then command-line overrides."""
    known = list(catalog())
    names = {info.name: code for code, info in catalog().items()}
    config_file = args.config
    if config_file is not None and not config_file.is_file():
        raise UsageError(f"--config {config_file}: no such file")
    if config_file is None and not args.isolated:
        config_file = find_config(anchor)
    settings = load_settings(config_file, known, names)
    if args.select is not None:
        # As in ruff: a --select starts afresh; the config's select/extend-select/ignore go.
        settings.select = validate_selectors(_split(args.select), known, "--select", names)
        settings.extend_select, settings.ignore = [], []
    settings.extend_select += validate_selectors(
        _split(args.extend_select), known, "--extend-select", names
    )
    settings.ignore += validate_selectors(_split(args.ignore), known, "--ignore", names)
    if args.per_file_ignores:
        settings.per_file_ignores = {}
        for item in args.per_file_ignores:
            pattern, sep, codes = item.rpartition(":")
            if not sep or not pattern or not codes.strip():
                raise UsageError(f"--per-file-ignores {item!r}: expected GLOB:CODES")
            settings.per_file_ignores[pattern] = validate_selectors(
                _split(codes), known, f"--per-file-ignores {pattern!r}", names
            )
    if args.target_version is not None:
        settings.target_version = parse_torch_version(args.target_version, "--target-version")
    if args.exclude is not None:
        settings.exclude = _split(args.exclude)
    settings.extend_exclude += _split(args.extend_exclude)
    if args.force_exclude is not None:
        settings.force_exclude = args.force_exclude
    if args.respect_gitignore is not None:
        settings.respect_gitignore = args.respect_gitignore
    return settings


def run_check_command(args: argparse.Namespace) -> int:
    raw_paths: list[str] = args.paths
    use_stdin = raw_paths == ["-"] or (not raw_paths and args.stdin_filename is not None)
    if "-" in raw_paths and not use_stdin:
        raise UsageError("`-` (standard input) cannot be combined with other paths")
    paths = [Path(p) for p in raw_paths] or [Path(".")]
    if not use_stdin:
        for path in paths:
            if not os.path.lexists(path):  # a looping link exists, and is reported per file
                raise UsageError(f"{path}: no such file or folder")
    anchor = (args.stdin_filename or Path(".")) if use_stdin else paths[0]
    settings = _settings(args, anchor)

    entries = catalog()
    enabled = settings.enabled_codes(
        ((code, info.default_enabled) for code, info in entries.items() if info.kind != "runtime"),
        {code: info.group for code, info in entries.items()},
    )
    options = RunOptions(
        enabled=enabled,
        fix=args.fix,
        unsafe_fixes=args.unsafe_fixes,
        diff=args.diff,
        target_version=settings.target_version,
    )
    stdin_data = sys.stdin.buffer.read() if use_stdin else None
    if args.add_noqa:
        if use_stdin or args.fix or args.diff:
            raise UsageError("--add-noqa works on files, without --fix or --diff")
        return _add_noqa(paths, settings, options, args.jobs)
    tune_gc()
    with _terminate_cleanly():
        results = run_check(
            paths,
            settings,
            options,
            jobs=args.jobs,
            use_cache=not args.no_cache,
            stdin=stdin_data,
            stdin_filename=args.stdin_filename,
        )

    if args.diff:
        changed = [r for r in results if r.original is not None and r.source is not None]
        with _output(args) as out:
            for r in changed:
                out.writelines(_diff_lines(r))
        return 1 if changed else 0
    out_stream = sys.stdout
    if use_stdin and args.fix:
        # Like ruff: the fixed code goes to stdout, the report to stderr.
        assert stdin_data is not None
        if results and results[0].source is not None and results[0].notebook is None:
            fixed = results[0].source if results[0].original is not None else None
            sys.stdout.write(fixed if fixed is not None else stdin_data.decode("utf-8", "replace"))
        elif results and results[0].notebook is not None and results[0].original is not None:
            sys.stdout.write(write_notebook(results[0].notebook, results[0].source or ""))
        else:
            sys.stdout.write(stdin_data.decode("utf-8", "replace"))
        sys.stdout.flush()
        out_stream = sys.stderr
    with _output(args, out_stream) as out:
        if args.statistics:
            report.write_statistics(results, out)
        else:
            report.FORMATS[args.format](results, out)
            if args.format == "text":
                report.write_summary(results, out, fix_mode=args.fix)
    found = any(r.findings for r in results)
    return 1 if found and not args.exit_zero else 0


def _add_noqa(paths: list[Path], settings: Settings, options: RunOptions, jobs: int | None) -> int:
    from torchdoctor.check.add_noqa import add_noqa

    # no cache: cached findings do not keep the statement lines a comment may go on
    results = run_check(paths, settings, options, jobs=jobs, use_cache=False)
    added = add_noqa(results)
    for reason in added.skipped:
        print(f"torchdoctor: warning: {reason}", file=sys.stderr)
    files = "file" if added.files == 1 else "files"
    print(f"Added {added.comments} noqa comment(s) in {added.files} {files}.")
    return 0


@contextlib.contextmanager
def _terminate_cleanly() -> Iterator[None]:
    """While checking, SIGTERM and Ctrl-C end the run at once and leave nothing behind.

    The default actions leave debris: SIGTERM ends this process on the spot (the
    workers and a half-written temp file of `--fix` stay), and KeyboardInterrupt,
    raised wherever the main thread happens to be, can land inside the process pool's
    own bookkeeping. Instead the handler kills the workers, deletes the temp file of a
    write under way and exits with 128 + the signal number, as a shell reports it.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set from the main thread
        return

    def stop(signum: int, frame: object) -> None:
        kill_workers()
        remove_temp_files_in_progress()
        sys.stdout.flush()
        os._exit(128 + signum)

    previous = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def _output(args: argparse.Namespace, default: TextIO | None = None) -> Iterator[TextIO]:
    """The report stream: --output-file (written whole at the end) or stdout."""
    if args.output_file is None:
        yield default or sys.stdout
        return
    buffer = io.StringIO()
    yield buffer
    try:
        args.output_file.write_text(buffer.getvalue(), encoding="utf-8")
    except OSError as exc:
        raise UsageError(f"--output-file {args.output_file}: {exc.strerror or exc}") from None


def _diff_lines(result: FileResult) -> list[str]:
    assert result.original is not None and result.source is not None
    if result.notebook is not None:
        return cell_diffs(result.notebook, result.source, result.display_path)
    return list(
        difflib.unified_diff(
            result.original.splitlines(keepends=True),
            result.source.splitlines(keepends=True),
            fromfile=f"a/{result.display_path}",
            tofile=f"b/{result.display_path}",
        )
    )


def run_rules_command(args: argparse.Namespace) -> int:
    entries = [info for info in catalog().values() if args.all or info.kind == "static"]
    if args.format == "json":
        json.dump(
            [
                {
                    "code": i.code,
                    "name": i.name,
                    "category": i.category,
                    "severity": i.severity.value,
                    "fix": i.fix.value,
                    "default_enabled": i.default_enabled,
                    "group": i.group,
                    "kind": i.kind,
                    "summary": i.summary,
                    "url": i.url,
                }
                for i in entries
            ],
            sys.stdout,
            indent=2,
        )
        print()
        return 0
    width = max((len(i.name) for i in entries), default=10)
    for i in entries:
        fix = {"none": " ", "safe": "*", "unsafe": "~"}[i.fix.value]
        on = "" if i.default_enabled else " (off by default)"
        print(
            f"{i.code}  {fix} {i.name:<{width}}  {i.group:<6}  {i.severity.value:<7}  "
            f"{i.summary}{on}"
        )
    print("\n* safe fix   ~ unsafe fix (--unsafe-fixes)   `torchdoctor rule CODE` for docs")
    print("bugs: on by default   advice: opt in with `--extend-select advice`")
    return 0


def run_rule_command(args: argparse.Namespace) -> int:
    info = lookup(args.code)
    if info is None:
        entries = catalog()
        hint = did_you_mean(args.code.strip().upper(), entries) or did_you_mean(
            args.code.strip().lower(), [entry.name for entry in entries.values()]
        )
        raise UsageError(
            f"unknown rule {args.code!r}{hint}", fix="`torchdoctor rules --all` lists every code"
        )
    print(f"# {info.code} {info.name}\n")
    print(
        f"Group: {info.group}. Category: {info.category}. Severity: {info.severity.value}. "
        f"Fix: {info.fix.value}. "
        + ("On by default." if info.default_enabled else "Off by default.")
        + ("" if info.kind == "static" else f" Raised by: {info.kind}.")
        + "\n"
    )
    print(info.doc)
    return 0
