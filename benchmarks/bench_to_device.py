#!/usr/bin/env python3
"""Benchmark td.to_device against the helpers other libraries ship, in one run.

Peers: accelerate.utils.send_to_device, Lightning's move_data_to_device,
lightning_utilities' apply_to_collection, and torch.utils._pytree.tree_map. The
floor is a bare loop calling `.to` over a pre-flattened list of the same
tensors. Every move targets `cpu`, where the tensors already are, so only the
traversal is timed. Cases: (a) a dict of 8 tensors, (b) a list of 1000 tensors,
(c) a 3-level dict/list/namedtuple/dataclass batch with 500 tensors.

A correctness pass moves each case to the `meta` device and counts the
tensors each helper actually moved, and tries the container kinds where peers
are known to fail (frozen dataclass, init=False field, defaultdict, deque, ...).

Usage: python3 benchmarks/bench_to_device.py [--repeat N] [--markdown]
The peers live in benchmarks/.venv (created on first run with torch==2.13.0,
accelerate and lightning; this repo is installed there without dependencies),
and the script re-runs itself inside it.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import os
import statistics
import subprocess
import sys
import timeit
from collections.abc import Callable
from pathlib import Path
from typing import Any, NamedTuple

ROOT = Path(__file__).resolve().parent.parent
VENV = ROOT / "benchmarks" / ".venv"
VENV_PYTHON = VENV / "bin" / "python"
PEERS = ("torch==2.13.0", "accelerate", "lightning")  # torch pinned: never upgraded by a peer


# --------------------------------------------------------------------------- environment


def ensure_venv() -> None:
    """Create benchmarks/.venv with the peers if needed, then re-run this script in it."""
    if Path(sys.prefix).resolve() == VENV.resolve():
        return
    if not VENV_PYTHON.exists():
        print(f"creating {VENV} ...", file=sys.stderr)
        subprocess.run([sys.executable, "-m", "venv", str(VENV)], check=True)
    probe = "import torch, accelerate, lightning, lightning_utilities, torchdoctor"
    if subprocess.run([str(VENV_PYTHON), "-c", probe], capture_output=True).returncode != 0:
        pip = [str(VENV_PYTHON), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
        print("installing peers into benchmarks/.venv ...", file=sys.stderr)
        subprocess.run([*pip, *PEERS], check=True)
        subprocess.run([*pip, "--no-deps", "-e", str(ROOT)], check=True)
    os.execv(str(VENV_PYTHON), [str(VENV_PYTHON), __file__, *sys.argv[1:]])


# --------------------------------------------------------------------------- cases


def build_cases() -> dict[str, tuple[Any, list[Any]]]:
    """name -> (batch, the same tensors pre-flattened for the floor)."""
    import torch

    def tensor() -> torch.Tensor:
        return torch.ones(4)

    class Pair(NamedTuple):
        a: torch.Tensor
        b: torch.Tensor

    @dataclasses.dataclass
    class Sample:
        x: torch.Tensor
        y: torch.Tensor
        pair: Pair

    small = {f"field{i}": tensor() for i in range(8)}
    many = [tensor() for _ in range(1000)]
    nested = {
        "samples": [Sample(tensor(), tensor(), Pair(tensor(), tensor())) for _ in range(50)],
        "features": {f"f{i}": [tensor() for _ in range(10)] for i in range(25)},
        "pairs": [Pair(tensor(), tensor()) for _ in range(25)],
    }
    flat_nested = (
        [t for s in nested["samples"] for t in (s.x, s.y, s.pair.a, s.pair.b)]
        + [t for v in nested["features"].values() for t in v]
        + [t for p in nested["pairs"] for t in p]
    )
    assert len(flat_nested) == 500
    return {
        "(a) dict of 8 tensors": (small, list(small.values())),
        "(b) list of 1000 tensors": (many, list(many)),
        "(c) nested, 500 tensors": (nested, flat_nested),
    }


def build_movers() -> dict[str, Callable[[Any, Any], Any]]:
    import torch
    from accelerate.utils import send_to_device
    from lightning.fabric.utilities.apply_func import move_data_to_device
    from lightning_utilities.core.apply_func import apply_to_collection
    from torch.utils._pytree import tree_map

    import torchdoctor as td

    tensor_type = torch.Tensor

    def pytree_move(batch: Any, device: Any) -> Any:
        return tree_map(lambda x: x.to(device) if isinstance(x, tensor_type) else x, batch)

    return {
        "torchdoctor to_device": lambda batch, device: td.to_device(batch, device),
        "accelerate send_to_device": send_to_device,
        "lightning move_data_to_device": move_data_to_device,
        "lightning_utilities apply_to_collection": lambda batch, device: apply_to_collection(
            batch, tensor_type, lambda t: t.to(device)
        ),
        "torch _pytree.tree_map": pytree_move,
    }


# --------------------------------------------------------------------------- timing


def time_case(
    batch: Any, flat: list[Any], movers: dict[str, Callable[[Any, Any], Any]], repeat: int
) -> dict[str, float]:
    """Median seconds per call for the floor and each mover, repeats interleaved."""
    import torch

    device = torch.device("cpu")
    calls: dict[str, Callable[[], Any]] = {"floor": lambda: [t.to(device) for t in flat]}
    for name, move in movers.items():
        calls[name] = lambda move=move: move(batch, device)
    timers = {name: timeit.Timer(call) for name, call in calls.items()}
    number = max(1, timers["floor"].autorange()[0])
    samples: dict[str, list[float]] = collections.defaultdict(list)
    for _ in range(repeat):
        for name, timer in timers.items():  # interleaved: drift hits everyone alike
            samples[name].append(timer.timeit(number) / number)
    return {name: statistics.median(values) for name, values in samples.items()}


def tensors_moved(batch: Any, total: int, move: Callable[[Any, Any], Any]) -> str:
    """How many of the case's tensors the helper really moves (to meta)."""
    import torch

    try:
        result = move(batch, torch.device("meta"))
    except Exception as exc:
        return f"raises {type(exc).__name__}"
    moved = count_tensors(result, "meta")
    return f"{moved}/{total}"


def count_tensors(obj: Any, device_type: str) -> int:
    import torch

    if isinstance(obj, torch.Tensor):
        return int(obj.device.type == device_type)
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return sum(
            count_tensors(getattr(obj, f.name), device_type) for f in dataclasses.fields(obj)
        )
    if isinstance(obj, collections.abc.Mapping):
        return sum(count_tensors(v, device_type) for v in obj.values())
    if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
        return sum(count_tensors(v, device_type) for v in obj)
    if hasattr(obj, "__dict__"):
        return sum(count_tensors(v, device_type) for v in vars(obj).values())
    return 0


# --------------------------------------------------------------------------- peer failure cases


def failure_cases() -> dict[str, Callable[[], Any]]:
    """Container kinds where some helper is known to go wrong: name -> builder."""
    import torch

    @dataclasses.dataclass
    class Plain:
        x: torch.Tensor

    @dataclasses.dataclass(frozen=True)
    class Frozen:
        x: torch.Tensor

    @dataclasses.dataclass
    class WithInitFalse:
        x: torch.Tensor
        y: torch.Tensor = dataclasses.field(init=False)

        def __post_init__(self) -> None:
            self.y = self.x + 1

    class Point(NamedTuple):
        x: torch.Tensor

    class MovesItself:
        def __init__(self, x: torch.Tensor) -> None:
            self.x = x

        def to(self, device: Any, non_blocking: bool = False) -> MovesItself:
            return MovesItself(self.x.to(device))

    return {
        "dataclass": lambda: Plain(torch.ones(1)),
        "frozen dataclass": lambda: Frozen(torch.ones(1)),
        "dataclass init=False field": lambda: WithInitFalse(torch.ones(1)),
        "defaultdict": lambda: collections.defaultdict(list, {"x": torch.ones(1)}),
        "namedtuple": lambda: Point(torch.ones(1)),
        "deque": lambda: collections.deque([torch.ones(1)]),
        "UserDict": lambda: collections.UserDict({"x": torch.ones(1)}),
        "object with .to()": lambda: MovesItself(torch.ones(1)),
    }


def check_failure_case(move: Callable[[Any, Any], Any], build: Callable[[], Any]) -> str:
    import torch

    obj = build()
    try:
        result = move(obj, torch.device("meta"))
    except Exception as exc:
        return f"raises {type(exc).__name__}"
    if type(result) is not type(obj):
        return f"returns {type(result).__name__}"
    total, moved = count_tensors(obj, "cpu"), count_tensors(result, "meta")
    return "ok" if moved == total else f"moves {moved} of {total} tensors"


# --------------------------------------------------------------------------- report


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=9, help="timing repeats per case")
    parser.add_argument("--markdown", action="store_true", help="print Markdown tables")
    args = parser.parse_args()
    ensure_venv()

    import accelerate
    import lightning
    import lightning_utilities
    import torch

    sys.path.insert(0, str(ROOT / "src"))  # benchmark this checkout even if installed elsewhere
    movers = build_movers()
    cases = build_cases()
    print(
        f"torch {torch.__version__}, accelerate {accelerate.__version__}, lightning "
        f"{lightning.__version__}, lightning-utilities {lightning_utilities.__version__}, "
        f"python {sys.version.split()[0]}; median of {args.repeat} interleaved repeats\n"
    )

    names = ["floor", *movers]
    header = ["case", *(f"{n} µs (x floor)" if n != "floor" else "floor µs" for n in names)]
    rows = []
    moved_rows = []
    goals = []
    for case, (batch, flat) in cases.items():
        medians = time_case(batch, flat, movers, args.repeat)
        floor = medians["floor"]
        row = [case, f"{floor * 1e6:.1f}"]
        row += [f"{medians[n] * 1e6:.1f} ({medians[n] / floor:.2f}x)" for n in movers]
        rows.append(row)
        moved_rows.append([case, *(tensors_moved(batch, len(flat), m) for m in movers.values())])
        ours = medians["torchdoctor to_device"]
        goals.append(
            f"{case}: td/floor {ours / floor:.2f} (goal <= 1.3), "
            f"accelerate/td {medians['accelerate send_to_device'] / ours:.2f} (goal > 1), "
            f"lightning/td {medians['lightning move_data_to_device'] / ours:.2f} (goal >= 2), "
            f"apply_to_collection/td "
            f"{medians['lightning_utilities apply_to_collection'] / ours:.2f} (goal >= 2)"
        )
    print_table(header, rows, args.markdown)
    print()
    print_table(["tensors moved to meta", *movers], moved_rows, args.markdown)
    print()
    failure_rows = [
        [case, *(check_failure_case(m, build) for m in movers.values())]
        for case, build in failure_cases().items()
    ]
    print_table(["container kind", *movers], failure_rows, args.markdown)
    print()
    for line in goals:
        print(line)
    return 0


def print_table(header: list[str], rows: list[list[str]], markdown: bool) -> None:
    if markdown:
        print("| " + " | ".join(header) + " |")
        print("|" + "|".join("---" for _ in header) + "|")
        for row in rows:
            print("| " + " | ".join(row) + " |")
        return
    widths = [max(len(r[i]) for r in [header, *rows]) for i in range(len(header))]
    for row in [header, *rows]:
        print("  ".join(cell.ljust(w) for cell, w in zip(row, widths, strict=True)))


if __name__ == "__main__":
    raise SystemExit(main())
