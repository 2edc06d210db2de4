"""The robustness campaign of issue 21, kept: `make fuzz` runs it for a set time.

    .venv/bin/python -m tests.robustness.campaign [--seconds 240] [--only PART,...] [--seed N]

Four parts share the time equally; each loops until its share is used up:

- programs: hypothesmith modules, alone and with torch code spliced in, through the
  checker (no crash, sane positions) and its fix loop (parses, idempotent, only touches
  flagged lines): the property tests of test_check_properties.py, run batch after batch;
- files: real files (torch's sources, the standard library) mutated (lines deleted,
  duplicated, swapped, bytes flipped, cut short, torch snippets spliced in), then
  `torchdoctor check --select ALL --fix` on them twice, as a user runs it: no crash, no
  TD900, a file that parsed still parses, the second run fixes nothing, no temp file;
- explain: random text, real error messages damaged and spliced with noise, and long
  repetitive inputs through `td.explain` (and its str()/JSON forms): never an exception;
- checkpoints: a saved checkpoint with bytes flipped or cut: `td.load_checkpoint` either
  reports it (CheckpointError) or loads exactly the saved values, never other values.

Each failing input is written to `fuzz-failures/` (its part, a number) and the exit
status is 1. `make test` runs a sample of a few seconds (test_campaign.py).
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import random
import shutil
import sys
import sysconfig
import tempfile
import time
import traceback
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

PARTS = ("programs", "files", "explain", "checkpoints")
FAILURES = Path("fuzz-failures")


@dataclass
class Tally:
    part: str
    cases: int = 0
    failures: list[str] = field(default_factory=list)  # where each failing input was saved
    seconds: float = 0.0

    def fail(self, what: str, detail: str, data: bytes | str = b"") -> None:
        FAILURES.mkdir(exist_ok=True)
        path = FAILURES / f"{self.part}-{len(self.failures) + 1}"
        raw = data.encode("utf-8", "surrogatepass") if isinstance(data, str) else data
        path.with_suffix(".input").write_bytes(raw)
        path.with_suffix(".txt").write_text(f"{what}\n\n{detail}\n", encoding="utf-8")
        self.failures.append(str(path))
        print(f"  FAILURE {self.part}: {what} (saved as {path}.*)", file=sys.stderr)


# ----------------------------------------------------------------------------- programs


def programs(
    tally: Tally, deadline: float, rng: random.Random, examples: int | None = None
) -> None:
    """Batches of the property tests; `examples` per batch (default: theirs, or 10)."""
    os.environ.setdefault("TORCHDOCTOR_FUZZ_EXAMPLES", "10")
    from hypothesis import settings

    from tests.robustness import test_check_properties as properties

    batches: list[Any] = [
        properties.test_never_raises_on_generated_modules,
        properties.test_never_raises_with_torch_code_spliced_in,
        properties.test_fix_parses_is_idempotent_and_only_touches_flagged_lines,
        properties.test_never_raises_on_libcst_generated_modules,
    ]
    # hypothesis reads a test's settings from this attribute each time the test runs
    attribute = "_hypothesis_internal_use_settings"
    saved = [getattr(batch, attribute) for batch in batches]
    try:
        for batch, own in zip(batches, saved, strict=True):
            if examples is not None:
                setattr(batch, attribute, settings(own, max_examples=examples))
        while True:  # one round at least, however short the time: the sample in `make test`
            batch = rng.choice(batches)
            try:
                batch()  # hypothesis draws a fresh random seed each call (no database)
            except Exception as exc:  # a property failed: hypothesis names the example
                tally.fail(f"{batch.__name__}: {type(exc).__name__}", _described(exc))
            tally.cases += getattr(batch, attribute).max_examples
            if time.monotonic() >= deadline:
                return
    finally:
        for batch, own in zip(batches, saved, strict=True):
            setattr(batch, attribute, own)


def _described(exc: BaseException) -> str:
    notes = "\n".join(getattr(exc, "__notes__", []))
    return "".join(traceback.format_exception(exc)) + "\n" + notes


# ----------------------------------------------------------------------------- files

SNIPPETS = (
    "import torch\nstate = torch.load(path)\n",
    "model = Net()\noptimizer = torch.optim.SGD(model.parameters(), lr=0.1)\nmodel.cuda()\n",
    "for x, y in loader:\n    loss = criterion(model(x), y)\n    loss.backward()\n"
    "    optimizer.step()\n",
    "with torch.no_grad():\n    out = model(x.to(device))\n",
)


def real_files() -> list[Path]:
    """The standard library's top-level modules and torch's nn, optim and data code."""
    files = sorted(Path(sysconfig.get_paths()["stdlib"]).glob("*.py"))
    try:
        import torch

        root = Path(torch.__file__).parent
        for package in ("nn", "optim", "utils/data", "amp"):
            files += sorted((root / package).rglob("*.py"))
    except ImportError:
        pass
    return files


def mutate(data: bytes, rng: random.Random) -> bytes:
    """One to three random edits of the kinds a half-saved or half-edited file shows."""
    lines = data.splitlines(keepends=True) or [b"\n"]
    for _ in range(rng.randint(1, 3)):
        kind = rng.randrange(7)
        i = rng.randrange(len(lines))
        if kind == 0 and len(lines) > 1:
            del lines[i]
        elif kind == 1:
            lines.insert(i, lines[rng.randrange(len(lines))])
        elif kind == 2:
            j = rng.randrange(len(lines))
            lines[i], lines[j] = lines[j], lines[i]
        elif kind == 3 and lines[i]:
            line = bytearray(lines[i])
            line[rng.randrange(len(line))] ^= 1 << rng.randrange(8)
            lines[i] = bytes(line)
        elif kind == 4:
            lines = lines[: i + 1]
            lines[-1] = lines[-1][: rng.randrange(len(lines[-1]) + 1)]
        elif kind == 5:
            indent = lines[i][: len(lines[i]) - len(lines[i].lstrip())]
            snippet = rng.choice(SNIPPETS).encode()
            lines.insert(i, b"".join(indent + s for s in snippet.splitlines(keepends=True)))
        else:
            lines.insert(i, bytes(rng.randrange(256) for _ in range(rng.randint(1, 8))))
    return b"".join(lines)


def _parses(data: bytes) -> bool:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # mutated code is odd on purpose
            ast.parse(data)
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        return False
    return True


def files(tally: Tally, deadline: float, rng: random.Random, batch: int = 30) -> None:
    from tests.robustness.cli import assert_no_crash, run_check

    sources = real_files()
    while True:  # one round at least
        with tempfile.TemporaryDirectory(prefix="td-fuzz-") as folder:
            root = Path(folder)
            written: dict[Path, bytes] = {}
            for n, path in enumerate(rng.sample(sources, min(batch, len(sources)))):
                target = root / f"f{n:03}_{path.name}"
                target.write_bytes(mutate(path.read_bytes(), rng))
                written[target] = target.read_bytes()
            for attempt in ("first --fix", "second --fix"):
                try:
                    run = run_check(["--select", "ALL", "--fix", "."], root, timeout=600)
                    assert_no_crash(run)
                except (AssertionError, OSError, ValueError) as exc:
                    tally.fail(f"{attempt}: {exc}"[:300], _described(exc))
                    _keep(root, tally)
                    break
                after = {p: p.read_bytes() for p in written}
                broken = [p.name for p in written if _parses(written[p]) and not _parses(after[p])]
                debris = [p.name for p in root.iterdir() if p.suffix == ".tmp"]
                if broken or debris:
                    tally.fail(f"{attempt}: broke {broken}, left {debris}", "")
                    _keep(root, tally)
                    break
                if attempt == "second --fix" and after != written:
                    changed = [p.name for p in written if after[p] != written[p]]
                    tally.fail(f"--fix is not idempotent on {changed}", "")
                    _keep(root, tally)
                written = after
            tally.cases += len(written)
        if time.monotonic() >= deadline:
            return


def _keep(folder: Path, tally: Tally) -> None:
    FAILURES.mkdir(exist_ok=True)
    shutil.copytree(folder, FAILURES / f"{tally.part}-{len(tally.failures)}-files")


# ----------------------------------------------------------------------------- explain


def explain(tally: Tally, deadline: float, rng: random.Random) -> None:
    import torchdoctor as td
    from torchdoctor.explain import kb

    examples = [example for entry in kb.entries() for example in entry.examples]
    alphabet = "abcXYZ019 _.:,'\"()[]{}\n\t\\/-+*#@!?éß€\u2028\x00" + "".join(
        {c for e in examples for c in e}
    )

    def noise(size: int) -> str:
        return "".join(rng.choice(alphabet) for _ in range(size))

    while True:  # one round at least
        kind = rng.randrange(3)
        if kind == 0:
            text = noise(rng.randint(1, 400))
        elif kind == 1:
            example = rng.choice(examples)
            cut = rng.randint(0, len(example))
            text = noise(rng.randint(0, 80)) + example[:cut] + noise(rng.randint(0, 40))
            text += example[cut:]
            if rng.random() < 0.5:
                text = f'Traceback (most recent call last):\n  File "{noise(10)}", line 1\n{text}'
        else:
            unit = rng.choice([noise(rng.randint(1, 6)), rng.choice(examples)[:20]])
            text = rng.choice(examples)[:60] + unit * (rng.randint(1_000, 50_000) // len(unit))
        try:
            explanation = td.explain(text)
            str(explanation)
            json.dumps(explanation.as_dict())
        except Exception as exc:
            tally.fail(f"explain raised {type(exc).__name__}: {exc}"[:300], _described(exc), text)
        tally.cases += 1
        if time.monotonic() >= deadline:
            return


# ----------------------------------------------------------------------------- checkpoints


def checkpoints(tally: Tally, deadline: float, rng: random.Random) -> None:
    try:
        import torch
    except ImportError:
        print("  checkpoints: torch is not installed; skipped", file=sys.stderr)
        return
    import torchdoctor as td
    from torchdoctor.errors import CheckpointError

    with tempfile.TemporaryDirectory(prefix="td-fuzz-") as folder:
        root = Path(folder)
        torch.manual_seed(0)
        model = torch.nn.Linear(8, 4)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        model(torch.randn(2, 8)).sum().backward()
        optimizer.step()
        good = td.save_checkpoint(root / "good.pt", model=model, optimizer=optimizer, epoch=3)
        data = good.read_bytes()
        original = td.load_checkpoint(good, device="cpu")
        damaged_path = root / "damaged.pt"
        while True:  # one round at least
            damaged = bytearray(data)
            if rng.random() < 0.8:
                for _ in range(rng.randint(1, 3)):
                    damaged[rng.randrange(len(damaged))] ^= 1 << rng.randrange(8)
            else:
                del damaged[rng.randrange(len(damaged)) :]
            damaged_path.write_bytes(damaged)
            try:
                loaded = td.load_checkpoint(damaged_path, device="cpu")
            except CheckpointError:
                pass  # reported: what a damaged file must get
            except Exception as exc:
                what = f"load_checkpoint raised {type(exc).__name__}: {exc}"[:300]
                tally.fail(what, _described(exc), bytes(damaged))
            else:
                if not _same(loaded, original):
                    tally.fail("a damaged file loaded as other values", "", bytes(damaged))
            tally.cases += 1
            if time.monotonic() >= deadline:
                return


def _same(a: Any, b: Any) -> bool:
    import torch

    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(_same, a, b))
    return type(a) is type(b) and a == b


# ----------------------------------------------------------------------------- running

RUNNERS: dict[str, Callable[[Tally, float, random.Random], None]] = {
    "programs": programs,
    "files": files,
    "explain": explain,
    "checkpoints": checkpoints,
}


def run(seconds: float, parts: tuple[str, ...] = PARTS, seed: int | None = None) -> list[Tally]:
    """Run `parts` for `seconds` in all, in equal shares; the tallies, in order."""
    seed = random.randrange(2**32) if seed is None else seed
    print(f"campaign: {seconds:g} s, parts {', '.join(parts)}, seed {seed}", flush=True)
    tallies = []
    for part in parts:
        tally = Tally(part)
        start = time.monotonic()
        RUNNERS[part](tally, start + seconds / len(parts), random.Random(f"{seed}-{part}"))
        tally.seconds = time.monotonic() - start
        print(
            f"{part:12} {tally.cases:7} cases in {tally.seconds:6.1f} s, "
            f"{len(tally.failures)} failures",
            flush=True,
        )
        tallies.append(tally)
    return tallies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--seconds", type=float, default=float(os.environ.get("FUZZ_SECONDS") or 240)
    )
    parser.add_argument("--only", default=",".join(PARTS), help=",".join(PARTS))
    parser.add_argument("--seed", type=int, help="repeat a campaign (printed at its start)")
    args = parser.parse_args(argv)
    parts = tuple(p for p in args.only.split(",") if p)
    unknown = set(parts) - set(PARTS)
    if unknown:
        parser.error(f"unknown parts {sorted(unknown)}; parts: {', '.join(PARTS)}")
    tallies = run(args.seconds, parts, args.seed)
    return 1 if any(t.failures for t in tallies) else 0


if __name__ == "__main__":
    raise SystemExit(main())
