"""`make bench`: every comparison in benchmarks/ in one go, results into benchmarks/README.md.

    .venv/bin/python benchmarks/run_all.py [--runs N] [--only STEP,...] [--skip STEP,...]
        [--corpus DIR] [--quick]

1. sets up benchmarks/.venv with the peers if it is missing (see _peers.py: torch==2.13.0
   in the same pip command as accelerate, lightning, torchfix, ruff and matplotlib;
   torchdoctor from this checkout with `pip install -e . --no-deps`);
2. writes the header section: machine, tool versions, date;
3. runs each benchmark script in the interpreter it needs (the peers live in
   benchmarks/.venv; the guard and simulation benchmarks use the project's .venv);
4. counts the findings of every rule on real code (torch's sources, the standard library
   and, if present, the repositories under /work/corpus);
5. times the check against its peers on growing subsets of the torch tree and plots it
   (benchmarks/check_scaling.png);
6. measures the check's peak memory per byte of source on big generated files.
7. recreates the clean corpus from git mirrors (corpus.py), measures recall on the real-bug
   corpus against TorchFix (bugs.py) and the strict precision review (precision.py).

Each script writes its own section of the README (between `<!-- begin: NAME -->` and
`<!-- end: NAME -->` markers, see _readme.py); scripts that only print get their output
recorded by this runner. Everything else in the README - the hand-judged precision
sections of the rule authors in particular - is kept verbatim. A step that fails is
reported in the header and the run goes on. Steps (for --only/--skip), in order:
to_device, guard, nonfinite, simulate, check, scaling, memory, device_rules, training_rules,
corpus, rules, bugs, precision, explain.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import importlib.metadata
import importlib.util
import json
import os
import platform
import re
import subprocess
import sys
import sysconfig
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))  # _peers, _readme: run as a script
import _peers
from _readme import README, write_section

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
WORK = HERE / ".work"
PYTHON = sys.executable  # the project's interpreter (`make bench` runs .venv/bin/python)
DEFAULT_CORPUS = Path("/work/corpus")
CORPUS_LIST = HERE / "corpus.txt"
PEER_PACKAGES = ("accelerate", "lightning", "lightning-utilities", "torchfix", "ruff", "matplotlib")


# --------------------------------------------------------------------------- running steps


@dataclass
class StepResult:
    name: str
    command: str
    status: str = "not run"
    seconds: float = 0.0
    output: str = ""
    started: datetime.datetime = field(
        default_factory=lambda: datetime.datetime.now(datetime.timezone.utc)
    )


@dataclass
class Run:
    args: argparse.Namespace
    started: datetime.datetime
    load: tuple[float, float, float]
    results: list[StepResult] = field(default_factory=list)
    peer_problem: str | None = None  # why benchmarks/.venv could not be set up

    def wanted(self, step: str) -> bool:
        if self.args.only and step not in self.args.only:
            return False
        return step not in self.args.skip


def run_command(
    name: str, command: Sequence[str], *, cwd: Path = ROOT, env: dict[str, str] | None = None
) -> StepResult:
    """Run a benchmark script, echoing its output live and keeping it."""
    shown = " ".join(_short(part) for part in command)
    print(f"\n=== {name}: {shown}", flush=True)
    result = StepResult(name, shown)
    started = time.perf_counter()
    lines: list[str] = []
    try:
        with subprocess.Popen(
            command,
            cwd=cwd,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            errors="replace",
            env={**os.environ, **(env or {})},
        ) as process:
            assert process.stdout is not None
            for line in process.stdout:
                print(line, end="", flush=True)
                lines.append(line)
        code = process.returncode
    except OSError as exc:
        code = -1
        lines.append(f"cannot start: {exc}\n")
    result.seconds = time.perf_counter() - started
    result.output = "".join(lines)
    if code == 0:
        result.status = "ok"
    else:
        last = next((ln.strip() for ln in reversed(lines) if ln.strip()), "no output")
        result.status = f"failed (exit {code}): {last[:200]}"
    return result


def _short(part: str) -> str:
    """Paths relative to the repository, so the README does not show this machine's."""
    try:
        return str(Path(part).relative_to(ROOT))
    except ValueError:
        return part


def torch_tree() -> Path:
    spec = importlib.util.find_spec("torch")  # the project's torch, found without importing
    if spec is None or not spec.submodule_search_locations:
        raise SystemExit("run_all: torch is not installed in this interpreter; run `make bench`")
    return Path(next(iter(spec.submodule_search_locations)))


# --------------------------------------------------------------------------- header


def machine() -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    memory = "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemTotal:"):
                memory = f"{int(line.split()[1]) / 2**20:.1f} GiB"
                break
    except OSError:
        pass
    usable = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    return {
        "CPU": cpu,
        "cores": f"{os.cpu_count()} ({usable} usable by this process)",
        "memory": memory,
        "OS": platform.platform(),
    }


def versions(run: Run) -> dict[str, str]:
    found = {"Python": platform.python_version()}
    for name in ("torch", "torchdoctor", "ruff"):
        try:
            found[name] = importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            found[name] = "not installed"
    commit = subprocess.run(
        ["git", "describe", "--always", "--dirty"], cwd=ROOT, capture_output=True, text=True
    ).stdout.strip()
    if commit:
        found["torchdoctor"] += f" (commit {commit})"
    found["ruff"] += " (project .venv: bench_check.py)"
    if run.peer_problem:
        found["peers"] = f"not available: {run.peer_problem}"
        return found
    probe = (
        "import importlib.metadata as m, json, platform, sys\n"
        "found = {p: m.version(p) for p in sys.argv[1:]}\n"
        "print(json.dumps({'python': platform.python_version(), **found}))"
    )
    out = subprocess.run(
        [str(_peers.PYTHON), "-c", probe, *PEER_PACKAGES], capture_output=True, text=True
    )
    try:
        peers = json.loads(out.stdout)
    except ValueError:
        found["peers"] = f"cannot query benchmarks/.venv: {out.stderr.strip()[-200:]}"
        return found
    for name in PEER_PACKAGES:
        label = f"{name} (benchmarks/.venv)" if name == "ruff" else name
        found[label] = peers[name]
    found["Python (benchmarks/.venv)"] = peers["python"]
    return found


_STEP_ROW = re.compile(r"^\| (?P<name>\w+) \| (?P<date>\d{4}-\d\d-\d\d \d\d:\d\d) \|.*$", re.M)


def previous_step_rows() -> dict[str, str]:
    """The header's step table as the README has it: a run of some steps keeps the others."""
    if not README.exists():
        return {}
    text = README.read_text(encoding="utf-8")
    start, end = text.find("<!-- begin: header -->"), text.find("<!-- end: header -->")
    if start < 0 or end < start:
        return {}
    return {m["name"]: m[0] for m in _STEP_ROW.finditer(text[start:end])}


def write_header(run: Run, final: bool) -> None:
    load = ", ".join(f"{x:.2f}" for x in run.load)
    rows = previous_step_rows()
    for r in run.results:
        when = f"{r.started:%Y-%m-%d %H:%M}"
        rows[r.name] = f"| {r.name} | {when} | `{r.command}` | {r.status} | {r.seconds / 60:.1f} |"
    lines = [
        "`make bench` (`benchmarks/run_all.py`) runs every comparison below in one go and "
        "rewrites the generated sections of this file; hand-written sections (the rule "
        "authors' hand-judged precision counts) are kept as they are. Each script can also "
        "be run alone (its docstring says how). Ratios are always measured side by side in "
        "one run; timings are medians of several repetitions.",
        "",
        f"Last run started {run.started:%Y-%m-%d %H:%M} UTC"
        + (" (still running)." if not final else "."),
        "",
        "| machine | |",
        "|---|---|",
        *(f"| {key} | {value} |" for key, value in machine().items()),
        f"| load average at the start of the last run (1, 5, 15 min) | {load} |",
        "",
        "| tool | version |",
        "|---|---|",
        *(f"| {key} | {value} |" for key, value in versions(run).items()),
        "",
        "| step | run (UTC) | command | result | minutes |",
        "|---|---|---|---|---:|",
        *(rows[name] for name in STEPS if name in rows),
        "",
        "The machine is a shared 2-core development box: other jobs ran during the "
        "benchmarks, so timings are CPU time where the scripts can measure it (which waiting "
        "for a core does not inflate), and absolute numbers are slower than on an idle "
        "machine; the ratios are what count.",
    ]
    write_section("header", "\n".join(lines), first=True)


# --------------------------------------------------------------------------- rules on real code


@dataclass
class Corpus:
    name: str
    root: Path
    exclude: str | None  # replaces the default excludes when set
    commit: str = ""


@dataclass
class CorpusResult:
    corpus: Corpus
    files: int = 0
    lines: int = 0
    seconds: float = 0.0
    codes: collections.Counter[str] = field(default_factory=collections.Counter)
    problem: str = ""


def recorded_commits() -> dict[str, str]:
    commits = {}
    if CORPUS_LIST.exists():
        for line in CORPUS_LIST.read_text(encoding="utf-8").splitlines():
            if line.strip() and not line.startswith("#"):
                repo, commit = line.split()
                commits[repo.replace("/", "+")] = commit
    return commits


def checked_files(corpus: Corpus) -> list[Path]:
    """Exactly the files `torchdoctor check` walks for this corpus."""
    sys.path.insert(0, str(ROOT / "src"))
    from torchdoctor.check.config import DEFAULT_EXCLUDE, Settings
    from torchdoctor.check.discovery import discover

    exclude = list(DEFAULT_EXCLUDE) if corpus.exclude is None else [corpus.exclude]
    settings = Settings(root=corpus.root, exclude=[e for e in exclude if e])
    return list(discover([corpus.root], settings))


def count_lines(path: Path) -> int:
    if path.suffix != ".ipynb":
        return path.read_bytes().count(b"\n")
    try:
        cells = json.loads(path.read_text(encoding="utf-8")).get("cells", [])
    except (OSError, ValueError, AttributeError):
        return 0
    total = 0
    for cell in cells if isinstance(cells, list) else []:
        if isinstance(cell, dict) and cell.get("cell_type") == "code":
            source = cell.get("source", "")
            total += len(source) if isinstance(source, list) else str(source).count("\n") + 1
    return total


def check_corpus(corpus: Corpus) -> CorpusResult:
    result = CorpusResult(corpus)
    files = checked_files(corpus)
    result.files = len(files)
    result.lines = sum(count_lines(p) for p in files)
    WORK.mkdir(parents=True, exist_ok=True)
    report = WORK / f"findings_{corpus.name.replace('/', '+')}.json"
    command = [PYTHON, "-m", "torchdoctor", "check", "--isolated", "--select", "ALL"]
    command += ["--format", "json", "--output-file", str(report), "--no-cache", "--exit-zero"]
    if corpus.exclude is not None:
        command += ["--exclude", corpus.exclude]
    started = time.perf_counter()
    done = subprocess.run([*command, str(corpus.root)], capture_output=True, text=True)
    result.seconds = time.perf_counter() - started
    if done.returncode != 0:
        result.problem = f"exit {done.returncode}: {done.stderr.strip()[-300:]}"
        return result
    try:
        findings = json.loads(report.read_text(encoding="utf-8"))
    except (OSError, ValueError) as exc:
        result.problem = f"no JSON report: {exc}"
        return result
    result.codes.update(f["code"] for f in findings)
    return result


def static_rules() -> list[tuple[str, str]]:
    out = subprocess.run(
        [PYTHON, "-m", "torchdoctor", "rules", "--format", "json"],
        capture_output=True,
        text=True,
        check=True,
    )
    return [
        (r["code"], r["name"] + ("" if r.get("default_enabled", True) else " (opt-in)"))
        for r in json.loads(out.stdout)
        if r.get("kind") == "static"
    ]


def rules_on_real_code(corpus_dir: Path) -> StepResult:
    started = time.perf_counter()
    step = StepResult(
        "rules", "torchdoctor check --isolated --select ALL --format json (per corpus)"
    )
    print(f"\n=== rules: {step.command}", flush=True)
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    corpora = [
        Corpus("torch", torch_tree(), exclude=""),
        Corpus("stdlib", stdlib, exclude="site-packages"),
    ]
    commits = recorded_commits()
    projects = sorted(p for p in corpus_dir.iterdir() if p.is_dir()) if corpus_dir.is_dir() else []
    for project in projects:
        repo = project.name.replace("+", "/", 1)
        corpora.append(Corpus(repo, project, None, commits.get(project.name, "not recorded")))
    results = []
    for corpus in corpora:
        result = check_corpus(corpus)
        results.append(result)
        found = sum(result.codes.values())
        print(
            f"  {corpus.name}: {result.files} files, {result.lines:,} lines, {found} findings"
            f"{', ' + result.problem if result.problem else ''} ({result.seconds:.0f} s)",
            flush=True,
        )
    write_section(
        "rules-on-real-code",
        rules_report(results, static_rules(), corpus_dir, bool(projects)),
        heading="Rules on real code",
    )
    problems = [f"{r.corpus.name}: {r.problem}" for r in results if r.problem]
    step.status = "ok" if not problems else "failed: " + "; ".join(problems)[:300]
    step.seconds = time.perf_counter() - started
    return step


def rules_report(
    results: list[CorpusResult], rules: list[tuple[str, str]], corpus_dir: Path, present: bool
) -> str:
    torch_result, stdlib_result, *projects = results
    project_codes: collections.Counter[str] = collections.Counter()
    for r in projects:
        project_codes.update(r.codes)
    columns = [("torch", torch_result.codes), ("stdlib", stdlib_result.codes)]
    if projects:
        columns.append((f"{len(projects)} projects", project_codes))

    def findings(r: CorpusResult) -> int:
        return sum(n for code, n in r.codes.items() if code not in ("TD001", "TD900"))

    def corpus_row(name: str, group: list[CorpusResult]) -> str:
        files = sum(r.files for r in group)
        lines = sum(r.lines for r in group)
        found = sum(findings(r) for r in group)
        per = f"{found / lines * 1e4:.2f}" if lines else "-"
        engine = [sum(r.codes[c] for r in group) for c in ("TD001", "TD900")]
        seconds = sum(r.seconds for r in group)
        return (
            f"| {name} | {files:,} | {lines:,} | {found} | {per} | {engine[0]} | {engine[1]} "
            f"| {seconds:.0f} |"
        )

    out = [
        "Every rule (`torchdoctor check --isolated --select ALL --format json`, the opt-in "
        "rules too) over code nobody here wrote: PyTorch's installed sources, the Python "
        "standard library (without site-packages) and real training projects. These are raw "
        "counts from the current rules; whether each finding is a true or a false alarm is "
        "judged by hand by the rule authors in their own sections of this file. The findings "
        "themselves are in `benchmarks/.work/findings_*.json` after a run.",
        "",
        "| corpus | files | lines | findings | per 10k lines | TD001 unparsable | "
        "TD900 internal error | seconds (wall) |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
        corpus_row("torch", [torch_result]),
        corpus_row("stdlib", [stdlib_result]),
    ]
    if projects:
        out.append(corpus_row(f"{len(projects)} projects", projects))
    out += [
        "",
        "| rule | name | " + " | ".join(name for name, _ in columns) + " | total |",
        "|---|---|" + "---:|" * (len(columns) + 1),
    ]
    for code, name in rules:
        counts = [codes[code] for _, codes in columns]
        out.append(f"| {code} | {name} | " + " | ".join(map(str, counts)) + f" | {sum(counts)} |")
    out.append("")
    if not present:
        out += [
            f"Real projects: not present ({corpus_dir} does not exist on this machine), so "
            "only torch and the standard library were checked. How to recreate it is below.",
            "",
        ]
    else:
        out += [
            "| project | commit | files | lines | findings | by rule |",
            "|---|---|---:|---:|---:|---|",
        ]
        for r in projects:
            codes = ", ".join(f"{c} {n}" for c, n in sorted(r.codes.items())) or "none"
            if r.problem:
                codes = f"check failed: {r.problem}"
            out.append(
                f"| {r.corpus.name} | {r.corpus.commit[:12]} | {r.files} | {r.lines:,} "
                f"| {findings(r)} | {codes} |"
            )
        out.append("")
    out += [
        f"The projects folder ({corpus_dir}, `--corpus DIR` to change it) is not part of the "
        "repository. It holds one folder per GitHub repository, named `owner+name`, with the "
        "repository's `.py` and `.ipynb` files at the commits listed in "
        "`benchmarks/corpus.txt` (tests included). `make bench` recreates it (step `corpus`) "
        "from git mirrors of those repositories, never from the network:",
        "",
        "```sh",
        ".venv/bin/python benchmarks/corpus.py rebuild   # reads /work/.mirror/owner+name/repo",
        "```",
        "",
        "It lists the repositories whose mirror is missing: fetch each with the search tool's "
        "`fetch` (which puts it at `/work/.mirror/owner+name/repo`), or place any `git clone "
        "--mirror` there, then run it again.",
    ]
    return "\n".join(out)


# --------------------------------------------------------------------------- captured output


_TIMING = re.compile(
    r"^\s+(?P<name>\S.*?)\s+wall\s+(?P<wall>[\d.]+) s\s+cpu\s+(?P<cpu>[\d.]+) s", re.M
)


def check_speed_section(result: StepResult) -> str:
    """bench_check.py prints its results; turn its timing lines into a table."""
    rows = []
    parse_cpu = None
    for match in _TIMING.finditer(result.output):
        name, wall, cpu = match["name"], float(match["wall"]), float(match["cpu"])
        if name.startswith("bare ast.parse"):
            parse_cpu = cpu
        ratio = f"{cpu / parse_cpu:.2f}x" if parse_cpu else ""
        rows.append(f"| {name} | {cpu:.2f} | {wall:.2f} | {ratio} |")
    facts = [
        ln.strip()
        for ln in result.output.splitlines()
        if ln.startswith(("tree:", "files:", "torchdoctor ")) or ln.strip().startswith("TorchFix")
    ]
    ratios = result.output.split("ratios (cpu time; wall time):", 1)
    lines = [
        "The numbers of this `make bench` run of `benchmarks/bench_check.py` (what it "
        'measures and how is described under "Check speed" above): '
        f"`{result.command}`. TorchFix is left out here because one run on the whole torch "
        'tree costs about 25 CPU minutes; it is timed on subsets under "Check time vs tree '
        'size". Median CPU seconds (user+sys) and wall seconds; x bare parse = CPU time over '
        "the bare parse with the same number of processes.",
        "",
        *(f"- {fact}" for fact in facts if not fact.startswith("TorchFix")),
        "",
    ]
    if rows:
        lines += ["| tool | CPU s | wall s | x bare parse |", "|---|---:|---:|---:|", *rows, ""]
    if len(ratios) == 2:
        lines += ["Ratios as the script prints them (CPU time; wall time):", ""]
        lines += [f"- {ln.strip()}" for ln in ratios[1].splitlines() if ln.strip()]
    if not rows:
        lines += ["Output:", "", "```text", result.output.strip()[-4000:], "```"]
    return "\n".join(lines)


def device_rules_section(result: StepResult) -> str:
    """bench_device_rules.py speed prints a Markdown table: keep it and its caption."""
    table = [ln for ln in result.output.splitlines() if ln.startswith("|")]
    caption = next(
        (ln.strip() for ln in result.output.splitlines() if "CPU seconds over" in ln), ""
    )
    lines = [
        "`benchmarks/bench_device_rules.py speed` (the device rules' author's profile of their "
        "cost) runs, interleaved as separate processes on the torch tree: a bare `ast.parse`; "
        "`torchdoctor check -j1` with a rule that fires almost nowhere (TD109: the engine's own "
        "cost); with the ten device rules; and with `--select TD1`. "
        f"Run by `make bench` as `{result.command}`.",
        "",
    ]
    if caption:
        lines += [caption.replace(str(ROOT) + "/", ""), ""]
    if table:
        lines += table
    else:
        lines += ["Output:", "", "```text", result.output.strip()[-4000:], "```"]
    return "\n".join(lines)


def training_rules_section(result: StepResult) -> str:
    """bench_training_rules.py prints a few lines per tree: keep them as they are."""
    output = result.output.strip().replace(str(ROOT) + "/", "")
    return "\n".join(
        [
            "`benchmarks/bench_training_rules.py` (the training-loop rules' author's profile) "
            "parses every file of the torch tree once, then times in the same process the CPU "
            "time the 15 training-loop rules (TD2xx-TD6xx) add together, and each alone. Run "
            f"by `make bench` as `{result.command}`:",
            "",
            "```text",
            output,
            "```",
        ]
    )


# --------------------------------------------------------------------------- main


STEPS = (
    "to_device",
    "guard",
    "nonfinite",
    "simulate",
    "check",
    "scaling",
    "memory",
    "device_rules",
    "training_rules",
    "corpus",
    "rules",
    "bugs",
    "precision",
    "explain",
)
PEER_STEPS = ("to_device", "scaling")  # need benchmarks/.venv (bugs runs without TorchFix)


def commands(args: argparse.Namespace, check_writes: bool) -> dict[str, list[str]]:
    """The command of every script step; --quick shrinks repeats and trees."""
    quick = args.quick
    runs = "1" if quick else str(args.runs)
    peer, here = str(_peers.PYTHON), str(HERE)
    small_tree = ["--tree", str(ROOT / "src")] if quick else []  # torchdoctor's own sources
    fractions = ["--fractions", "1/256,1/128,1/64", "--torchfix-up-to", "1/128"] if quick else []
    return {
        "to_device": [
            peer, f"{here}/bench_to_device.py", "--write", "--repeat", "3" if quick else "11"
        ],
        "guard": [PYTHON, f"{here}/bench_guard.py", "--write", "--repeats", "3" if quick else "15"],
        "nonfinite": [
            PYTHON, f"{here}/bench_nonfinite.py", "--write", "--repeats", "3" if quick else "15"
        ],
        "simulate": [
            PYTHON, f"{here}/bench_simulate.py", "--write", "--rounds", "2" if quick else "5"
        ],
        # TorchFix on the whole tree costs about 25 CPU minutes a run: scaling times it
        "check": [
            PYTHON, f"{here}/bench_check.py", "--runs", runs, "--skip-torchfix", *small_tree,
            *(["--write"] if check_writes else []),
        ],
        "device_rules": [
            PYTHON, f"{here}/bench_device_rules.py", "speed", "--runs", runs, *small_tree
        ],
        "training_rules": [
            PYTHON, f"{here}/bench_training_rules.py",
            str(ROOT / "src") if quick else str(torch_tree()),
        ],
        "explain": [PYTHON, f"{here}/explain_accuracy.py", "--repeat", "1" if quick else "3"],
        "memory": [
            PYTHON, f"{here}/bench_check_memory.py", "--write", "--sizes", "1" if quick else "2,8"
        ],
        "scaling": [
            peer, f"{here}/bench_check_scaling.py", "--write", "--tree", str(torch_tree()),
            "--runs", runs, *fractions,
        ],
        # the clean corpus and the real-bug corpus, recreated from fetched git mirrors
        "corpus": [PYTHON, f"{here}/corpus.py", "rebuild", "--into", str(args.corpus)],
        "bugs": [PYTHON, f"{here}/bugs.py", "bench"],
        "precision": [
            PYTHON, f"{here}/precision.py", "run", "--write", "--corpus", str(args.corpus)
        ],
    }  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=3, help="timed runs of each check command")
    names = ",".join(STEPS)
    parser.add_argument("--only", type=lambda s: s.split(","), default=[], help=names)
    parser.add_argument("--skip", type=lambda s: s.split(","), default=[], help=names)
    parser.add_argument("--corpus", type=Path, default=DEFAULT_CORPUS, help="real projects")
    parser.add_argument(
        "--quick", action="store_true", help="few repeats and small trees: checks the pipeline"
    )
    args = parser.parse_args(argv)
    unknown = set(args.only + args.skip) - set(STEPS)
    if unknown:
        parser.error(f"unknown steps: {', '.join(sorted(unknown))} (steps: {names})")
    run = Run(args, datetime.datetime.now(datetime.timezone.utc), os.getloadavg())
    try:
        _peers.ensure_peer_venv()
    except (subprocess.CalledProcessError, OSError) as exc:
        run.peer_problem = f"could not set up benchmarks/.venv ({exc})"
    if run.peer_problem is None and not _peers.ready():
        run.peer_problem = "benchmarks/.venv is incomplete after pip install"
    write_header(run, final=False)

    # bench_check.py prints only (for now): its output is recorded here unless it writes
    check_writes = "--write" in (HERE / "bench_check.py").read_text(encoding="utf-8")
    planned = commands(args, check_writes)
    for name in STEPS:
        if not run.wanted(name):
            continue
        if name in PEER_STEPS and run.peer_problem:
            run.results.append(StepResult(name, "-", f"not run: {run.peer_problem}"))
            continue
        result = rules_on_real_code(args.corpus) if name == "rules" else None
        result = result or run_command(name, planned[name])
        run.results.append(result)
        if result.status != "ok":
            continue
        if name == "check" and not check_writes:
            heading = "Check speed: this run"
            write_section("check-speed-run", check_speed_section(result), heading=heading)
        elif name == "device_rules":
            heading = "Device rules: engine and rule cost"
            write_section("device-rules-speed", device_rules_section(result), heading=heading)
        elif name == "training_rules":
            heading = "Training-loop rules: cost"
            write_section("training-rules-cost", training_rules_section(result), heading=heading)
    write_header(run, final=True)
    print("\n" + "\n".join(f"{r.name}: {r.status} ({r.seconds / 60:.1f} min)" for r in run.results))
    return 0 if all(r.status == "ok" for r in run.results) else 1


if __name__ == "__main__":
    raise SystemExit(main())
