"""Texts to compare a rewritten text scan with the pattern it replaces: random strings
made of the pieces that matter to it, and every fixture file."""

from __future__ import annotations

import random
from collections.abc import Iterator
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def random_texts(
    pieces: list[str], *, seed: int, longest: int, count: int = 20_000
) -> Iterator[str]:
    """`count` strings of 0 to `longest` pieces drawn from `pieces` (the same for a seed)."""
    rng = random.Random(seed)
    for _ in range(count):
        yield "".join(rng.choice(pieces) for _ in range(rng.randint(0, longest)))


def fixture_texts() -> Iterator[tuple[Path, str]]:
    """(path, text) of every Python fixture file."""
    for path in sorted(FIXTURES.rglob("*.py")):
        yield path, path.read_text(encoding="utf-8")
