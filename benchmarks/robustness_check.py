"""`torchdoctor check` over every .py file of the installed torch package and the stdlib.

The goal: zero internal errors (TD900), zero crashes (exit code 2 or a traceback), on a
large body of real code nobody here wrote. Every rule is enabled (`--select ALL`), every
file is named on the command line (so none is skipped by excludes), and the counts of
files, findings per code and unparsable files (TD001: the stdlib's deliberately broken
test files) are written to benchmarks/README.md under "Robustness".

    .venv/bin/python benchmarks/robustness_check.py [--no-readme]
"""

from __future__ import annotations

import argparse
import collections
import json
import platform
import subprocess
import sys
import sysconfig
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from _readme_section import write_subsection  # benchmarks/ is on sys.path: run as a script


def torch_files() -> tuple[Path, list[Path]]:
    import torch

    root = Path(torch.__file__).parent
    return root, sorted(root.rglob("*.py"))


def stdlib_files() -> tuple[Path, list[Path]]:
    root = Path(sysconfig.get_paths()["stdlib"])
    skip = {"site-packages", "dist-packages"}
    files = [p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts)]
    return root, sorted(files)


def check_files(files: list[Path]) -> dict[str, object]:
    """Run the real CLI on `files`; return exit code, findings, stderr and seconds."""
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "findings.json"
        # a few thousand paths fit in argv easily; naming them skips no file by excludes
        command = [
            sys.executable,
            "-m",
            "torchdoctor",
            "check",
            "--isolated",
            "--no-cache",
            "--select",
            "ALL",
            "--format",
            "json",
            "--output-file",
            str(out),
            *map(str, files),
        ]
        started = time.perf_counter()
        proc = subprocess.run(command, capture_output=True, text=True, cwd=tmp)
        seconds = time.perf_counter() - started
        findings = json.loads(out.read_text()) if out.exists() else None
    return {
        "returncode": proc.returncode,
        "findings": findings,
        "stderr": proc.stderr,
        "seconds": seconds,
    }


@dataclass
class TreeResult:
    tree: str
    root: Path
    files: int
    lines: int
    findings: int  # real findings (not TD001/TD900)
    td900: int
    exit: int
    seconds: float
    codes: dict[str, int] = field(default_factory=dict)
    unparsable: list[str] = field(default_factory=list)  # files reported as TD001


def summarise(name: str, root: Path, files: list[Path]) -> tuple[TreeResult, list[str]]:
    result = check_files(files)
    findings = result["findings"]
    problems: list[str] = []
    if result["returncode"] not in (0, 1):
        problems.append(f"{name}: exit code {result['returncode']}")
    stderr = str(result["stderr"])
    if "Traceback" in stderr or "internal error" in stderr:
        problems.append(f"{name}: crash on stderr:\n{stderr[-2000:]}")
    if not isinstance(findings, list):
        problems.append(f"{name}: no JSON report")
        findings = []
    codes = collections.Counter(f["code"] for f in findings)
    problems += [
        f"{name}: TD900 in {f['filename']}: {f['message']}"
        for f in findings
        if f["code"] == "TD900"
    ]
    unparsable = sorted(
        {str(Path(f["filename"]).relative_to(root)) for f in findings if f["code"] == "TD001"}
    )
    row = TreeResult(
        tree=name,
        root=root,
        files=len(files),
        lines=sum(len(p.read_bytes().splitlines()) for p in files),
        findings=sum(v for k, v in codes.items() if k not in ("TD001", "TD900")),
        td900=codes.get("TD900", 0),
        exit=int(str(result["returncode"])),
        seconds=float(str(result["seconds"])),
        codes=dict(sorted(codes.items())),
        unparsable=unparsable,
    )
    return row, problems


def readme_body(rows: list[TreeResult]) -> str:
    import torch

    lines = [
        "`benchmarks/robustness_check.py` runs `torchdoctor check --select ALL` (every rule, "
        "the opt-in ones too) over every `.py` file of the installed torch package and of "
        "the Python standard library, each file named on the command line. Goal: zero "
        "internal errors (TD900) and zero crashes (exit code 2, a traceback).",
        "",
        f"torch {torch.__version__}, Python {platform.python_version()}, "
        f"{time.strftime('%Y-%m-%d')}.",
        "",
        "| tree | files | lines | findings | TD001 (unparsable) | TD900 | exit | seconds |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        lines.append(
            f"| {r.tree} | {r.files} | {r.lines} | {r.findings} | {len(r.unparsable)} "
            f"| {r.td900} | {r.exit} | {r.seconds:.0f} |"
        )
    lines.append("")
    for r in rows:
        codes = ", ".join(f"{k} {v}" for k, v in r.codes.items()) or "none"
        lines.append(f"- {r.tree}: findings by code: {codes}.")
        if r.unparsable:
            shown = ", ".join(f"`{p}`" for p in r.unparsable[:8])
            more = len(r.unparsable) - 8
            lines.append(
                f"  Unparsable (reported as TD001, the run went on): {shown}"
                + (f" and {more} more" if more > 0 else "")
                + "."
            )
    lines += [
        "",
        "Seconds are wall time on the shared 2-core development machine while other jobs "
        "loaded it; they are not a speed benchmark. The test suite repeats this on every "
        "20th file (`tests/robustness/test_real_code.py`).",
    ]
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-readme", action="store_true", help="print only")
    args = parser.parse_args()
    rows: list[TreeResult] = []
    problems: list[str] = []
    for name, (root, files) in (("torch", torch_files()), ("stdlib", stdlib_files())):
        print(f"checking {len(files)} files of {name} ({root}) ...", flush=True)
        row, found = summarise(name, root, files)
        rows.append(row)
        problems += found
        print(
            f"  {row.files} files, {row.findings} findings, {len(row.unparsable)} TD001, "
            f"{row.td900} TD900, exit {row.exit}, {row.seconds:.0f} s"
        )
    body = readme_body(rows)
    print(body)
    if not args.no_readme:
        write_subsection("check over torch and the standard library", body)
    for problem in problems:
        print("PROBLEM:", problem, file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())
