"""Check time vs tree size: torchdoctor, a bare ast.parse, ruff and TorchFix on growing
subsets of PyTorch's sources, as a table and a log-log plot (benchmarks/check_scaling.png).

    benchmarks/.venv/bin/python benchmarks/bench_check_scaling.py [--tree PATH] [--runs 3]
        [--fractions 1/64,1/16,1/4] [--torchfix-up-to 1/8] [--write]

The subsets are nested: the tree's .py files are shuffled once with a fixed seed and each
subset is the shortest prefix holding the given fraction of the tree's lines, so every
subset contains the smaller ones and mixes all of torch's packages. Each tool runs as its
own process on exactly the same files, named on the command line, one core each:

- bare ast.parse: a Python process that reads and parses the files, nothing else;
- torchdoctor: `torchdoctor check --isolated --no-cache -j1` (every default rule);
- ruff (a speed reference in Rust): `ruff check --isolated --no-cache --select E,F,W`
  with RAYON_NUM_THREADS=1;
- TorchFix: `torchfix -j 1` (it skips files without "torch" in them before parsing).

Reported: the median CPU time (user+sys of the child) of `--runs` runs, interleaved;
TorchFix, by far the slowest (about 1 ms of CPU per line), runs once per subset up to
`--torchfix-up-to`. Runs in
benchmarks/.venv (matplotlib, ruff and TorchFix live there; see _peers.py).
"""

from __future__ import annotations

import argparse
import importlib.metadata
import importlib.util
import os
import platform
import random
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _readme: run as a script
from _readme import write_section

HERE = Path(__file__).resolve().parent
WORK = HERE / ".work"
PLOT = HERE / "check_scaling.png"
BIN = Path(sys.executable).parent
TOOLS = ("bare ast.parse", "torchdoctor check -j1", "ruff (1 thread)", "TorchFix -j1")

_PARSE = """
import ast, sys
for path in open(sys.argv[1], encoding="utf-8").read().splitlines():
    try:
        with open(path, "rb") as handle:
            ast.parse(handle.read())
    except (SyntaxError, ValueError):
        pass
"""


@dataclass
class Subset:
    fraction: Fraction
    files: list[Path]
    lines: int
    cpu: dict[str, list[float]] = field(default_factory=dict)  # tool -> seconds per run

    def median(self, tool: str) -> float | None:
        runs = self.cpu.get(tool)
        return statistics.median(runs) if runs else None


def default_tree() -> Path:
    spec = importlib.util.find_spec("torch")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch is not installed here; pass --tree PATH")
    return Path(next(iter(spec.submodule_search_locations)))


def nested_subsets(tree: Path, fractions: Sequence[Fraction]) -> list[Subset]:
    files = sorted(tree.rglob("*.py"))
    random.Random(0).shuffle(files)
    counts = [path.read_bytes().count(b"\n") for path in files]
    total = sum(counts)
    subsets = []
    for fraction in sorted(fractions):
        running, end = 0, 0
        while end < len(files) and running < total * fraction:
            running += counts[end]
            end += 1
        subsets.append(Subset(fraction, files[:end], running))
    return subsets


def child_cpu(command: Sequence[str], env: dict[str, str] | None = None) -> float:
    """CPU seconds (user+sys) the command's process tree used."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    result = subprocess.run(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        check=False,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if result.returncode not in (0, 1):
        tail = result.stderr.decode(errors="replace").strip()[-500:]
        raise RuntimeError(f"{Path(command[0]).name} exited {result.returncode}: {tail}")
    return (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def commands(subset: Subset, list_file: Path) -> dict[str, tuple[list[str], dict[str, str]]]:
    paths = [str(p) for p in subset.files]
    td = [sys.executable, "-m", "torchdoctor", "check", "--isolated", "--no-cache", "-j1"]
    td += ["--exit-zero", "--format", "concise"]
    ruff = [str(BIN / "ruff"), "check", "--isolated", "--no-cache", "--exit-zero", "-q"]
    ruff += ["--select", "E,F,W"]
    return {
        "bare ast.parse": ([sys.executable, "-c", _PARSE, str(list_file)], {}),
        "torchdoctor check -j1": ([*td, *paths], {}),
        "ruff (1 thread)": ([*ruff, *paths], {"RAYON_NUM_THREADS": "1"}),
        "TorchFix -j1": ([str(BIN / "torchfix"), "-j", "1", *paths], {}),
    }


def measure(subsets: list[Subset], runs: int, torchfix_up_to: Fraction) -> dict[str, str]:
    """Fill each subset's CPU times; return tool -> why it was not (fully) run."""
    skipped: dict[str, str] = {}
    for tool, binary in (("ruff (1 thread)", "ruff"), ("TorchFix -j1", "torchfix")):
        if not (BIN / binary).exists():
            skipped[tool] = f"`{binary}` is not installed in {BIN.parent}"
    WORK.mkdir(parents=True, exist_ok=True)
    for subset in subsets:
        list_file = WORK / f"scaling_{subset.fraction.numerator}_{subset.fraction.denominator}.txt"
        list_file.write_text("\n".join(str(p) for p in subset.files) + "\n", encoding="utf-8")
        todo = commands(subset, list_file)
        for tool in skipped:
            todo.pop(tool, None)
        torchfix = todo.pop("TorchFix -j1", None)
        for command, env in todo.values():  # untimed warm-up: file cache, .pyc files
            child_cpu(command, env)
        for _ in range(runs):
            for tool, (command, env) in todo.items():
                subset.cpu.setdefault(tool, []).append(child_cpu(command, env))
        if torchfix is not None and subset.fraction <= torchfix_up_to:
            subset.cpu["TorchFix -j1"] = [child_cpu(*torchfix)]
        times = ", ".join(f"{tool} {subset.median(tool):.2f} s" for tool in subset.cpu)
        print(f"{subset.lines:>9,} lines, {len(subset.files):>4} files: {times}", flush=True)
    if "TorchFix -j1" not in skipped and any(s.fraction > torchfix_up_to for s in subsets):
        skipped["TorchFix -j1"] = (
            f"run once per subset up to {torchfix_up_to} of the tree only: beyond that one "
            "run costs minutes of CPU"
        )
    return skipped


def plot(subsets: list[Subset], title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 5), dpi=120)
    styles = {"bare ast.parse": "o--", "torchdoctor check -j1": "o-", "ruff (1 thread)": "s-"}
    for tool in TOOLS:
        points = [(s.lines, s.median(tool)) for s in subsets if s.median(tool) is not None]
        if points:
            xs, ys = zip(*points, strict=True)
            axes.plot(xs, ys, styles.get(tool, "^-"), label=tool, linewidth=2, markersize=6)
    axes.set_xscale("log")
    axes.set_yscale("log")
    axes.set_xlabel("lines of Python checked (nested random subsets of torch's sources)")
    axes.set_ylabel("CPU seconds (median), one core")
    axes.set_title(title, fontsize=11)
    axes.grid(True, which="both", alpha=0.3)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1), borderaxespad=0)
    figure.tight_layout()
    temp = PLOT.with_name(f".{PLOT.name}.tmp")
    figure.savefig(temp, format="png")
    os.replace(temp, PLOT)


def report(subsets: list[Subset], skipped: dict[str, str], tree: Path, runs: int) -> str:
    def cell(subset: Subset, tool: str, versus: str | None) -> str:
        value = subset.median(tool)
        if value is None:
            return "not run"
        base = subset.median(versus) if versus else None
        return f"{value:.2f}" + (f" ({value / base:.1f}x)" if base else "")

    rows = [
        f"| {s.lines:,} | {len(s.files)} | {cell(s, 'bare ast.parse', None)} "
        f"| {cell(s, 'torchdoctor check -j1', 'bare ast.parse')} "
        f"| {cell(s, 'ruff (1 thread)', 'bare ast.parse')} "
        f"| {cell(s, 'TorchFix -j1', 'bare ast.parse')} |"
        for s in subsets
    ]
    growth = []
    for tool in TOOLS:
        measured = [(s.lines, s.median(tool)) for s in subsets if s.median(tool) is not None]
        if len(measured) > 1:
            (low_lines, low), (high_lines, high) = measured[0], measured[-1]
            growth.append(
                f"{tool} {high / low:.1f}x for {high_lines / low_lines:.0f}x the lines"  # type: ignore[operator]
            )
    versions = (
        f"ruff {importlib.metadata.version('ruff')}, "
        f"TorchFix {importlib.metadata.version('torchfix')}, "
        f"matplotlib {importlib.metadata.version('matplotlib')}, Python {platform.python_version()}"
    )
    lines = [
        "`benchmarks/bench_check_scaling.py` runs each tool as its own process on nested "
        f"random subsets of `{shown(tree)}`, the same files named on the command "
        "line for every tool, one core each (`-j1`, ruff with `RAYON_NUM_THREADS=1`). "
        f"CPU seconds (user+sys of the child), median of {runs} interleaved runs after an "
        "untimed warm-up; TorchFix once. In brackets: x the bare `ast.parse` of the same "
        f"files. {versions}.",
        "",
        "| lines | files | bare ast.parse s | torchdoctor check s | ruff (E,F,W) s | TorchFix s |",
        "|---:|---:|---:|---:|---:|---:|",
        *rows,
        "",
        "![check time vs tree size](check_scaling.png)",
        "",
        "Growth from the smallest to the largest subset measured: " + "; ".join(growth) + ". "
        "Proportional growth is a straight line of slope 1 on the log-log plot.",
    ]
    for tool, why in skipped.items():
        lines += ["", f"{tool}: {why}."]
    return "\n".join(lines)


def shown(path: Path) -> str:
    """The path relative to the repository when it is inside it (the README is shared)."""
    try:
        return str(path.relative_to(HERE.parent))
    except ValueError:
        return str(path)


def parse_fraction(text: str) -> Fraction:
    value = Fraction(text)
    if not 0 < value <= 1:
        raise argparse.ArgumentTypeError(f"a fraction of the tree, in (0, 1]: {text}")
    return value


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tree", type=Path, help="folder to take subsets of (default: torch)")
    parser.add_argument("--runs", type=int, default=3, help="timed runs per tool and subset")
    parser.add_argument(
        "--fractions",
        type=lambda text: [parse_fraction(f) for f in text.split(",")],
        default=[Fraction(1, 64), Fraction(1, 32), Fraction(1, 16), Fraction(1, 8), Fraction(1, 4)],
        help="subset sizes as fractions of the tree's lines (default: 1/64,1/32,...,1/4)",
    )
    parser.add_argument(
        "--torchfix-up-to",
        type=parse_fraction,
        default=Fraction(1, 8),
        help="largest subset TorchFix runs on (about 1 ms of CPU per line: default 1/8)",
    )
    parser.add_argument("--write", action="store_true", help="update benchmarks/README.md")
    args = parser.parse_args()
    tree = (args.tree or default_tree()).resolve()
    started = time.perf_counter()
    subsets = nested_subsets(tree, args.fractions)
    print(f"{tree}: subsets of {', '.join(str(s.lines) for s in subsets)} lines", flush=True)
    try:
        skipped = measure(subsets, args.runs, args.torchfix_up_to)
    except RuntimeError as exc:
        print(f"bench_check_scaling: {exc}", file=sys.stderr)
        return 1
    title = f"Check time vs tree size ({tree.name} sources, Python {platform.python_version()})"
    plot(subsets, title)
    body = report(subsets, skipped, tree, args.runs)
    print()
    print(body)
    print(f"\n({time.perf_counter() - started:.0f} s wall)")
    if args.write:
        write_section("check-scaling", body, heading="Check time vs tree size")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
