"""Speed and precision of the device rules (TD102-TD112) and their dataflow.

    .venv/bin/python benchmarks/bench_device_rules.py speed [--tree PATH] [--runs 5]
    .venv/bin/python benchmarks/bench_device_rules.py precision [ROOT ...]

speed: on one tree (default: PyTorch's installed sources), runs, interleaved and
`--runs` times each, as separate processes: a bare `ast.parse` of every file;
`torchdoctor check --no-cache -j1` with a rule that fires almost nowhere (TD109:
the engine's own cost: discovery, reading, project index, parsing); with the ten
device rules; and with `--select TD1` (the whole family, TD101 included). It
reports the CPU time (user+sys) of each child, min and median, and the ratios to
the bare parse. CPU time, not wall time: the machine may be shared.

precision: runs the device rules over each ROOT (default: every repository under
/work/corpus, PyTorch's sources, the standard library without site-packages) and
prints, per root, the lines of Python checked and the findings per rule, plus
every finding, so each one can be read and judged by hand.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import resource
import statistics
import subprocess
import sys
import sysconfig
import tempfile
from collections import Counter
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
BIN = Path(sys.executable).parent
DEVICE_RULES = "TD102,TD103,TD104,TD105,TD106,TD107,TD108,TD109,TD110,TD112"
CORPUS = Path("/work/corpus")
STDLIB = Path(sysconfig.get_paths()["stdlib"])

_PARSE = """
import ast, sys
for path in open(sys.argv[1], encoding="utf-8").read().splitlines():
    try:
        with open(path, "rb") as handle:
            ast.parse(handle.read())
    except (SyntaxError, ValueError):
        pass
"""


def torch_tree() -> Path:
    import importlib.util

    spec = importlib.util.find_spec("torch")
    if spec is None or spec.origin is None:
        sys.exit("torch is not installed in this interpreter; pass --tree")
    return Path(spec.origin).parent


def child_cpu(cmd: list[str]) -> float:
    """CPU seconds (user+sys) one child process used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False)
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def speed(tree: Path, runs: int) -> None:
    files = sorted(str(p) for p in tree.rglob("*.py"))
    listing = Path(tempfile.mkdtemp(prefix="bench-device-rules-")) / "files.txt"
    listing.write_text("\n".join(files), encoding="utf-8")
    check = [str(BIN / "torchdoctor"), "check", "--isolated", "--no-cache", "-j1"]
    check += ["--exclude", "", "--exit-zero", "--format", "concise"]
    commands = {
        "bare ast.parse": [sys.executable, "-c", _PARSE, str(listing)],
        "engine only (TD109)": [*check, "--select", "TD109", str(tree)],
        "device rules": [*check, "--select", DEVICE_RULES, str(tree)],
        "--select TD1": [*check, "--select", "TD1", str(tree)],
    }
    times: dict[str, list[float]] = {name: [] for name in commands}
    for run in range(runs):
        for name, cmd in commands.items():
            times[name].append(child_cpu(cmd))
        print(f"run {run + 1}/{runs}: " + ", ".join(f"{n} {t[-1]:.1f}s" for n, t in times.items()))
    base_min = min(times["bare ast.parse"])
    base_median = statistics.median(times["bare ast.parse"])
    print(f"\n{tree} ({len(files)} files), CPU seconds over {runs} interleaved runs\n")
    print("| run | min | median | min / parse | median / parse |")
    print("|---|---|---|---|---|")
    for name, values in times.items():
        low, mid = min(values), statistics.median(values)
        ratios = f"{low / base_min:.2f}x | {mid / base_median:.2f}x"
        print(f"| {name} | {low:.1f} | {mid:.1f} | {ratios} |")


def python_lines(root: Path, skip: str | None) -> int:
    total = 0
    for path in root.rglob("*"):
        if skip and skip in path.relative_to(root).parts:
            continue
        if path.suffix == ".py":
            with contextlib.suppress(OSError):
                total += path.read_bytes().count(b"\n")
        elif path.suffix == ".ipynb":
            try:
                cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
            except (OSError, ValueError):
                continue
            for cell in cells:
                if cell.get("cell_type") == "code":
                    source = cell.get("source", "")
                    total += len(source) if isinstance(source, list) else source.count("\n") + 1
    return total


def precision(roots: list[Path], selected: str = DEVICE_RULES) -> None:
    """Per-root lines and findings of the `selected` rules (comma-separated codes)."""
    rules = selected.split(",")
    totals: Counter[str] = Counter()
    total_lines = 0
    print("| corpus | lines | " + " | ".join(rules) + " |")
    print("|---|---|" + "---|" * len(rules))
    findings_text: list[str] = []
    for root in roots:
        # the standard library's folder holds site-packages: not part of the corpus
        skip = "site-packages" if root == STDLIB else None
        cmd = [str(BIN / "torchdoctor"), "check", "--isolated", "--no-cache", "--exit-zero"]
        cmd += ["--exclude", skip or "", "--select", selected, "--format", "json"]
        out = subprocess.run([*cmd, str(root)], capture_output=True, text=True, check=False)
        try:
            found = [f for f in json.loads(out.stdout or "[]") if f["code"] in rules]
        except ValueError:
            print(f"{root}: {out.stderr.strip()[:200]}", file=sys.stderr)
            continue
        counts = Counter(f["code"] for f in found)
        totals.update(counts)
        lines = python_lines(root, skip)
        total_lines += lines
        print(f"| {root.name} | {lines:,} | " + " | ".join(str(counts[r]) for r in rules) + " |")
        for f in found:
            where = f"cell {f['cell']}:" if f.get("cell") else ""
            findings_text.append(f"{f['filename']}:{where}{f['line']}: {f['code']} {f['message']}")
    print(f"| total | {total_lines:,} | " + " | ".join(str(totals[r]) for r in rules) + " |")
    print("\n" + "\n".join(findings_text))


def default_roots() -> list[Path]:
    roots = sorted(p for p in CORPUS.iterdir() if p.is_dir()) if CORPUS.is_dir() else []
    roots.append(torch_tree())
    roots.append(STDLIB)
    return roots


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sp = sub.add_parser("speed")
    sp.add_argument("--tree", type=Path)
    sp.add_argument("--runs", type=int, default=5)
    pr = sub.add_parser("precision")
    pr.add_argument("roots", nargs="*", type=Path)
    args = parser.parse_args()
    os.chdir(ROOT)
    if args.command == "speed":
        speed(args.tree or torch_tree(), args.runs)
    else:
        precision(args.roots or default_roots())


if __name__ == "__main__":
    main()
