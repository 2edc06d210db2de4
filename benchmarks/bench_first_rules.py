"""Precision of the first, syntactic rules (TD101, TD207-TD209, TD303, TD401-TD403, TD601-TD604).

    .venv/bin/python benchmarks/bench_first_rules.py [ROOT ...]

Runs the twelve rules over each ROOT separately, as a user would on one project
(`torchdoctor check --isolated --no-cache --select ...`; default roots: every repository
under /work/corpus, PyTorch's installed sources, the standard library without
site-packages) and prints, per root, the lines of Python checked and the findings per
rule, then every finding, so each one can be read and judged by hand. TD207 is off by
default; selecting it by code turns it on. The runner is the device rules' campaign's
(`bench_device_rules.precision`), given this rule list.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

from bench_device_rules import default_roots, precision  # noqa: E402

FIRST_RULES = "TD101,TD207,TD208,TD209,TD303,TD401,TD402,TD403,TD601,TD602,TD603,TD604"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="*", type=Path)
    args = parser.parse_args()
    roots = [root.resolve() for root in args.roots] or default_roots()
    os.chdir(HERE.parent)
    precision(roots, FIRST_RULES)


if __name__ == "__main__":
    main()
