"""CPU cost of the training-loop rules (TD2xx-TD6xx) against a bare `ast.parse`.

    .venv/bin/python benchmarks/bench_training_rules.py TREE [TREE ...]

For every tree, in this one process: the CPU time to `ast.parse` each file, and the
CPU time `check_source` adds when it runs the 15 training-loop rules together on the
already parsed tree (they share one analysis per file, as in a real run), plus each
rule run alone. CPU time (`time.process_time`) is used because the development
machine is shared: wall time also counts waiting for a core.
"""

from __future__ import annotations

import ast
import contextlib
import sys
import time
from pathlib import Path

from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.config import Settings
from torchdoctor.check.discovery import discover
from torchdoctor.check.engine import check_source, decode_source
from torchdoctor.check.registry import rules_by_code

CODES = [
    "TD201",
    "TD202",
    "TD203",
    "TD204",
    "TD205",
    "TD206",
    "TD213",
    "TD214",
    "TD301",
    "TD302",
    "TD404",
    "TD501",
    "TD502",
    "TD605",
    "TD606",
]


def measure(tree: Path) -> None:
    files = [f for f in discover([tree], Settings(root=Path.cwd())) if f.suffix == ".py"]
    sources: list[tuple[str, str, ast.Module]] = []
    parse = 0.0
    lines = 0
    for f in files:
        with contextlib.suppress(UnicodeDecodeError, SyntaxError, LookupError, ValueError):
            text = decode_source(f.read_bytes())
            start = time.process_time()
            parsed = ast.parse(text)
            parse += time.process_time() - start
            sources.append((str(f), text, parsed))
            lines += text.count("\n") + 1
    project = build_project(text for _, text, _ in sources)
    rules = [rules_by_code()[code] for code in CODES]

    def run(selected: list[type]) -> float:
        start = time.process_time()
        for path, text, parsed in sources:
            check_source(text, path, selected, project, tree=parsed)
        return time.process_time() - start

    together = run(rules)
    print(f"{tree}: {len(sources)} files, {lines:,} lines")
    print(f"  ast.parse            {parse:7.2f} s cpu")
    print(f"  15 rules together    {together:7.2f} s cpu  = {together / parse:5.2f}x parse")
    alone = {rule.code: run([rule]) for rule in rules}
    slowest = sorted(alone.items(), key=lambda kv: -kv[1])[:5]
    print("  slowest alone: " + ", ".join(f"{c} {s:.2f} s" for c, s in slowest))


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__)
        return 2
    for tree in argv:
        measure(Path(tree))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
