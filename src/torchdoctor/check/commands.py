"""CLI commands of the static checker: `check`, `rules`, `rule CODE`."""

from __future__ import annotations

import argparse
import difflib
import json
import sys
from pathlib import Path
from typing import Any

from torchdoctor.catalog import catalog, lookup
from torchdoctor.check import report
from torchdoctor.check.config import find_config, load_settings, validate_selectors
from torchdoctor.check.engine import RunOptions
from torchdoctor.check.runner import run_check
from torchdoctor.errors import UsageError


def register(subparsers: Any) -> None:
    check = subparsers.add_parser(
        "check",
        help="statically check Python files and notebooks (no torch needed)",
        description="Statically check PyTorch code for device, training-loop, loss, "
        "checkpoint and data-loading mistakes. Exit 0: clean; 1: findings; 2: error.",
    )
    check.add_argument("paths", nargs="*", type=Path, help="files or folders (default: .)")
    check.add_argument("--select", help="comma-separated codes or prefixes to enable (TD1,TD402)")
    check.add_argument("--extend-select", help="codes or prefixes to enable on top")
    check.add_argument("--ignore", help="codes or prefixes to disable")
    check.add_argument("--exclude", help="comma-separated globs replacing the default excludes")
    check.add_argument("--extend-exclude", help="comma-separated globs to exclude as well")
    check.add_argument(
        "--format",
        default="text",
        choices=sorted(report.FORMATS),
        help="output format (default: text)",
    )
    check.add_argument("--fix", action="store_true", help="apply safe fixes in place")
    check.add_argument(
        "--unsafe-fixes", action="store_true", help="with --fix/--diff, apply unsafe fixes too"
    )
    check.add_argument("--diff", action="store_true", help="show fixes as a diff; write nothing")
    check.add_argument("--statistics", action="store_true", help="count findings by code")
    check.add_argument("--config", type=Path, help="pyproject.toml to use (default: nearest)")
    check.add_argument("--isolated", action="store_true", help="ignore all configuration files")
    check.add_argument("--exit-zero", action="store_true", help="exit 0 even with findings")
    check.set_defaults(func=run_check_command)

    rules = subparsers.add_parser("rules", help="list every rule code")
    rules.add_argument("--format", choices=("text", "json"), default="text")
    rules.add_argument("--all", action="store_true", help="include engine and runtime-only codes")
    rules.set_defaults(func=run_rules_command)

    rule = subparsers.add_parser("rule", help="show one rule's documentation")
    rule.add_argument("code", help="a rule code (TD402) or name (load-without-map-location)")
    rule.set_defaults(func=run_rule_command)


def _split(value: str | None) -> list[str]:
    return [v.strip() for v in value.split(",") if v.strip()] if value else []


def run_check_command(args: argparse.Namespace) -> int:
    paths: list[Path] = args.paths or [Path(".")]
    for path in paths:
        if not path.exists():
            raise UsageError(f"{path}: no such file or folder")
    known = list(catalog())
    config_file = args.config
    if config_file is not None and not config_file.is_file():
        raise UsageError(f"--config {config_file}: no such file")
    if config_file is None and not args.isolated:
        config_file = find_config(paths[0])
    settings = load_settings(config_file, known)
    if args.select is not None:
        settings.select = validate_selectors(_split(args.select), known, "--select")
    settings.extend_select += validate_selectors(
        _split(args.extend_select), known, "--extend-select"
    )
    settings.ignore += validate_selectors(_split(args.ignore), known, "--ignore")
    if args.exclude is not None:
        settings.exclude = _split(args.exclude)
    settings.extend_exclude += _split(args.extend_exclude)

    entries = catalog()
    enabled = settings.enabled_codes(
        (code, info.default_enabled) for code, info in entries.items() if info.kind != "runtime"
    )
    options = RunOptions(
        enabled=enabled, fix=args.fix, unsafe_fixes=args.unsafe_fixes, diff=args.diff
    )
    results = run_check(paths, settings, options)

    out = sys.stdout
    if args.diff:
        for r in results:
            if r.original is not None and r.source is not None:
                out.writelines(
                    difflib.unified_diff(
                        r.original.splitlines(keepends=True),
                        r.source.splitlines(keepends=True),
                        fromfile=f"a/{r.display_path}",
                        tofile=f"b/{r.display_path}",
                    )
                )
        return 1 if any(r.original is not None for r in results) else 0
    if args.statistics:
        report.write_statistics(results, out)
    else:
        report.FORMATS[args.format](results, out)
        if args.format == "text":
            report.write_summary(results, out, fix_mode=args.fix)
    found = any(r.findings for r in results)
    return 1 if found and not args.exit_zero else 0


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
        print(f"{i.code}  {fix} {i.name:<{width}}  {i.severity.value:<7}  {i.summary}{on}")
    print("\n* safe fix   ~ unsafe fix (--unsafe-fixes)   `torchdoctor rule CODE` for docs")
    return 0


def run_rule_command(args: argparse.Namespace) -> int:
    info = lookup(args.code)
    if info is None:
        raise UsageError(
            f"unknown rule {args.code!r}", fix="`torchdoctor rules --all` lists every code"
        )
    print(f"# {info.code} {info.name}\n")
    print(
        f"Category: {info.category}. Severity: {info.severity.value}. "
        f"Fix: {info.fix.value}. "
        + ("On by default." if info.default_enabled else "Off by default.")
        + ("" if info.kind == "static" else f" Raised by: {info.kind}.")
        + "\n"
    )
    print(info.doc)
    return 0
