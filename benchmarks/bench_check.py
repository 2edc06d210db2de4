"""Time `torchdoctor check` against a bare `ast.parse`, TorchFix and ruff on one large tree.

    .venv/bin/python benchmarks/bench_check.py                  # PyTorch's installed sources
    .venv/bin/python benchmarks/bench_check.py --tree PATH --runs 5 --torchfix-runs 1
    .venv/bin/python benchmarks/bench_check.py --per-rule       # which rule costs what

Every tool runs as its own process on the same files, cold-started, `--runs` times
after one untimed warm-up; the median wall time and the median CPU time (user+sys of
the child) are reported. CPU time is what to compare on a loaded machine: wall time
also counts waiting for cores other jobs hold.

- bare parse: a Python process that reads and `ast.parse`s exactly the files
  torchdoctor checks (same interpreter, same process count: 1, then all cores).
- torchdoctor: `torchdoctor check --isolated --no-cache -j1` (then `-j` all cores).
- TorchFix (installed into benchmarks/.venv by this script): `torchfix -j 1 TREE`
  (it skips files without "torch" in them before parsing; its count is printed).
- ruff (speed reference, rules E, F, W): one thread (RAYON_NUM_THREADS=1), then all.
"""

from __future__ import annotations

import argparse
import ast
import compileall
import contextlib
import importlib.util
import os
import resource
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from torchdoctor.check.analysis.project_facts import build_project

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / ".work"
PEER_VENV = HERE / ".venv"
TORCH_PIN = "torch==2.13.0"  # installed with every peer so pip never upgrades torch


# -- the bare-parse child --------------------------------------------------------------
def _parse_chunk(paths: Sequence[str]) -> int:
    parsed = 0
    for path in paths:
        try:
            with open(path, "rb") as handle:
                ast.parse(handle.read())
            parsed += 1
        except (SyntaxError, ValueError):
            pass
    return parsed


def parse_files(list_file: Path, procs: int) -> None:
    paths = list_file.read_text(encoding="utf-8").splitlines()
    if procs == 1:
        parsed = _parse_chunk(paths)
    else:
        import multiprocessing

        chunks = [paths[i :: procs * 8] for i in range(procs * 8)]
        with multiprocessing.get_context("fork").Pool(procs) as pool:
            parsed = sum(pool.map(_parse_chunk, chunks))
    print(f"parsed {parsed} of {len(paths)} files")


# -- timing ---------------------------------------------------------------------------------
@dataclass
class Timing:
    name: str
    wall: list[float]
    cpu: list[float]

    @property
    def wall_median(self) -> float:
        return statistics.median(self.wall)

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)


def run_once(command: Sequence[str], env: dict[str, str] | None) -> tuple[float, float]:
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(
        command,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        env={**os.environ, **(env or {})},
        check=False,
    )
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode not in (0, 1):
        raise SystemExit(f"{command[0]} failed ({proc.returncode}): {proc.stderr.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return wall, cpu


Job = tuple[str, Sequence[str], dict[str, str] | None]  # name, command, extra environment


def measure(jobs: Sequence[Job], runs: int) -> list[Timing]:
    """Time each command `runs` times, in rounds (a, b, c, a, b, c, ...).

    The VM's speed drifts by 10% or more over minutes; interleaved, the commands
    compared in one round see about the same drift (`round_ratios`)."""
    for _, command, env in jobs:
        run_once(command, env)  # warm-up: file cache, .pyc files
    timings = [Timing(name, [], []) for name, _, _ in jobs]
    for _ in range(runs):
        for timing, (_, command, env) in zip(timings, jobs, strict=True):
            wall, cpu = run_once(command, env)
            timing.wall.append(wall)
            timing.cpu.append(cpu)
    for timing in timings:
        print(
            f"  {timing.name:<34} wall {timing.wall_median:7.2f} s   cpu {timing.cpu_median:7.2f} s"
            f"   (runs: {', '.join(f'{w:.2f}' for w in timing.wall)})",
            flush=True,
        )
    return timings


def round_ratios(a: Timing, b: Timing) -> str:
    """a's CPU over b's, round by round (measured minutes apart at most), and the median."""
    ratios = [x / y for x, y in zip(a.cpu, b.cpu, strict=False)]
    shown = ", ".join(f"{r:.2f}" for r in ratios)
    return f"{statistics.median(ratios):.2f}x (rounds: {shown})"


def side_by_side(check: Sequence[str], parse: Sequence[str], runs: int) -> list[float]:
    """check's CPU over the bare parse's, measured at the same time, one per core.

    Rounds of interleaved runs still drift apart when the VM's speed changes between
    them (the rounds of one run have spread from 3.4x to 4.7x). Here each round starts
    one check and, beside it, runs the bare parse again and again until the check ends:
    both see the same drift. A round's ratio is the check's CPU over the mean CPU of
    the parses that ran beside it (the last one is waited for, and counts). Sharing
    the machine's caches raises this ratio above the interleaved one: it compares
    commits with each other, not with the goal."""
    ratios = []
    for _ in range(runs):
        checking = subprocess.Popen(check, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        parses: list[float] = []
        check_cpu = None
        while check_cpu is None:
            parsing = subprocess.Popen(parse, stdout=subprocess.DEVNULL)
            while parsing.returncode is None:  # whichever child ends first
                pid, status, usage = os.wait4(-1, 0)
                cpu = usage.ru_utime + usage.ru_stime
                if pid == checking.pid:
                    checking.returncode, check_cpu = os.waitstatus_to_exitcode(status), cpu
                elif pid == parsing.pid:
                    parsing.returncode = os.waitstatus_to_exitcode(status)
                    parses.append(cpu)
        ratios.append(check_cpu / statistics.mean(parses))
    return ratios


# -- peers ------------------------------------------------------------------------------------
def torchfix_command() -> list[str] | None:
    """benchmarks/.venv/bin/torchfix, installing it there first if needed."""
    python = PEER_VENV / "bin" / "python"
    if not python.exists():
        print(f"creating {PEER_VENV} for the peers ...", flush=True)
        subprocess.run([sys.executable, "-m", "venv", str(PEER_VENV)], check=True)
    torchfix = PEER_VENV / "bin" / "torchfix"
    if not torchfix.exists():
        print("installing TorchFix into benchmarks/.venv ...", flush=True)
        result = subprocess.run(
            [str(python), "-m", "pip", "install", "-q", "torchfix", TORCH_PIN],
            capture_output=True,
            text=True,
            check=False,
        )
        if result.returncode != 0 or not torchfix.exists():
            print(f"  could not install TorchFix: {result.stderr.strip()[-500:]}")
            return None
    return [str(torchfix)]


def version_of(command: Sequence[str]) -> str:
    result = subprocess.run([*command, "--version"], capture_output=True, text=True, check=False)
    return (result.stdout or result.stderr).strip().splitlines()[-1] if result else "?"


# -- the tree ------------------------------------------------------------------------------------
def default_tree() -> Path:
    spec = importlib.util.find_spec("torch")  # finds the package without importing it
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("torch is not installed here; pass --tree PATH")
    return Path(next(iter(spec.submodule_search_locations)))


def tree_files(tree: Path) -> list[Path]:
    """Exactly the files `torchdoctor check --isolated TREE` checks."""
    sys.path.insert(0, str(ROOT / "src"))
    from torchdoctor.check.config import Settings
    from torchdoctor.check.discovery import discover

    return list(discover([tree], Settings(root=Path.cwd())))


def per_rule(files: Sequence[Path]) -> None:
    """CPU seconds each rule adds on top of parsing and walking, all in this process."""
    from torchdoctor.check.engine import check_source, decode_source
    from torchdoctor.check.registry import rule_classes

    sources = []
    for f in files:
        with contextlib.suppress(UnicodeDecodeError, SyntaxError, LookupError):
            sources.append((str(f), decode_source(f.read_bytes())))
    project = build_project(text for _, text in sources)
    rules = rule_classes()
    spent = dict.fromkeys([r.code for r in rules], 0.0)
    parse = 0.0
    for path, text in sources:
        start = time.process_time()
        try:
            tree = ast.parse(text)
        except (SyntaxError, ValueError):
            continue
        parse += time.process_time() - start
        for rule in rules:
            start = time.process_time()
            check_source(text, path, [rule], project, tree=tree)
            spent[rule.code] += time.process_time() - start
    print(f"parse: {parse:.2f} s cpu for {len(sources)} files; per rule, run alone:")
    print("  (each includes its own walk, and analyses rules share, so they overlap)")
    for code, seconds in sorted(spent.items(), key=lambda kv: -kv[1]):
        print(f"  {code}  {seconds:7.2f} s  {seconds / parse:6.2f}x parse")


def compile_own_bytecode() -> None:
    """Write torchdoctor's `.pyc` files before the timed runs, as installing a package
    does. Where PYTHONDONTWRITEBYTECODE is set (this project's machines set it) no run
    writes them, and every timed check would first compile torchdoctor's own ~200
    modules: 0.2 s of CPU (1% of the run) that an installed tool never spends."""
    compileall.compile_dir(ROOT / "src" / "torchdoctor", quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--tree", type=Path, help="folder to check (default: installed torch)")
    parser.add_argument("--runs", type=int, default=5, help="timed runs per tool (median)")
    parser.add_argument("--torchfix-runs", type=int, default=1, help="TorchFix is slow")
    parser.add_argument("--skip-torchfix", action="store_true")
    parser.add_argument(
        "--per-rule", action="store_true", help="only time each rule alone, in this process"
    )
    parser.add_argument("--parse-files", type=Path, help=argparse.SUPPRESS)
    parser.add_argument("--procs", type=int, default=1, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.parse_files:
        parse_files(args.parse_files, args.procs)
        return

    tree = (args.tree or default_tree()).resolve()
    files = tree_files(tree)
    compile_own_bytecode()
    if args.per_rule:
        per_rule(files)
        return
    data = [f.read_bytes() for f in files]
    lines = sum(d.count(b"\n") for d in data)
    with_torch = sum(1 for d in data if b"torch" in d)
    WORK.mkdir(parents=True, exist_ok=True)
    list_file = WORK / "check_files.txt"
    list_file.write_text("\n".join(str(f) for f in files) + "\n", encoding="utf-8")
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    cores = cores or 1
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")

    from torchdoctor import __version__
    from torchdoctor.check.registry import rule_classes

    print(f"tree: {tree}")
    print(
        f"files: {len(files)} (.py/.pyi), {lines:,} lines, {sum(map(len, data)) / 1e6:.1f} MB; "
        f"{with_torch} contain 'torch'"
    )
    print(
        f"torchdoctor {__version__} with {len(rule_classes())} rules; python "
        f"{sys.version.split()[0]}; {cores} cores; load average {load:.1f}"
    )

    py = sys.executable
    here = str(Path(__file__).resolve())
    td = [py, "-m", "torchdoctor", "check", "--isolated", "--no-cache", "--exit-zero"]
    td += ["--format", "concise", str(tree)]
    ruff = [str(Path(py).parent / "ruff"), "check", "--isolated", "--no-cache", "--exit-zero"]
    ruff += ["--no-respect-gitignore", "--select", "E,F,W", "-q", str(tree)]

    results: dict[str, Timing] = {}
    print("one process (interleaved rounds):")
    one = measure(
        [
            ("bare ast.parse", [py, here, "--parse-files", str(list_file)], None),
            ("torchdoctor check -j1", [*td, "-j1"], None),
            ("ruff check (1 thread)", ruff, {"RAYON_NUM_THREADS": "1"}),
        ],
        args.runs,
    )
    results.update(zip(("parse1", "td1", "ruff1"), one, strict=True))
    tf = None if args.skip_torchfix else torchfix_command()
    if tf is not None:
        name = f"TorchFix -j1 ({version_of(tf)})"
        (results["torchfix1"],) = measure(
            [(name, [*tf, "-j", "1", str(tree)], None)], args.torchfix_runs
        )
    side: list[float] = []
    if cores > 1:
        print("one process each, side by side (check beside repeated bare parses):")
        side = side_by_side([*td, "-j1"], [py, here, "--parse-files", str(list_file)], args.runs)
        print(f"  rounds: {', '.join(f'{r:.2f}' for r in side)}")
    if cores > 1:
        print(f"{cores} processes (interleaved rounds):")
        many = measure(
            [
                (
                    f"bare ast.parse ({cores} procs)",
                    [py, here, "--parse-files", str(list_file), "--procs", str(cores)],
                    None,
                ),
                (f"torchdoctor check -j{cores}", [*td, f"-j{cores}"], None),
                ("ruff check (all threads)", ruff, None),
            ],
            args.runs,
        )
        results.update(zip(("parseN", "tdN", "ruffN"), many, strict=True))

    def ratio(a: str, b: str, kind: str) -> str:
        if a not in results or b not in results:
            return "n/a"
        x = getattr(results[a], f"{kind}_median")
        y = getattr(results[b], f"{kind}_median")
        return f"{x / y:.2f}x"

    print("ratios (cpu time; wall time):")
    print(f"  torchdoctor -j1 / bare parse:  {ratio('td1', 'parse1', 'cpu')}; "
          f"{ratio('td1', 'parse1', 'wall')}   (goal <= 3x)")  # fmt: skip
    print(f"  torchdoctor -j1 / bare parse, CPU round by round: "
          f"{round_ratios(results['td1'], results['parse1'])}")  # fmt: skip
    if side:
        print(f"  torchdoctor -j1 / bare parse, CPU side by side: {statistics.median(side):.2f}x "
              f"(rounds: {', '.join(f'{r:.2f}' for r in side)})")  # fmt: skip
    if cores > 1:
        print(f"  torchdoctor -jN / bare parse -N: {ratio('tdN', 'parseN', 'cpu')}; "
              f"{ratio('tdN', 'parseN', 'wall')}")  # fmt: skip
    print(f"  TorchFix -j1 / torchdoctor -j1:  {ratio('torchfix1', 'td1', 'cpu')}; "
          f"{ratio('torchfix1', 'td1', 'wall')}   (goal >= 50x)")  # fmt: skip
    print(f"  torchdoctor -j1 / ruff 1 thread: {ratio('td1', 'ruff1', 'cpu')}; "
          f"{ratio('td1', 'ruff1', 'wall')}")  # fmt: skip


if __name__ == "__main__":
    main()
