"""`syntax.findall_at` gives what `findall` gives for the patterns it stands in for."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from torchdoctor.check.analysis.syntax import findall_at
from torchdoctor.check.rules.td215_inplace_on_saved_tensor import _SELF_ASSIGNED, _SELF_CALL

FIXTURES = Path(__file__).parent / "fixtures"
PATTERNS = [_SELF_CALL, _SELF_ASSIGNED]

TRICKY = [
    "self.run(x)\nself.x = 1\n",
    "self.self.x(",  # the call is the second `self.`
    "myself.x(1)\n",
    "self.x: self.T = 3\n",  # one match holds the next `self.`: findall skips it
    "self.x == 2\nself.y :int= 4\n",
    "",
]


@pytest.mark.parametrize("text", TRICKY)
def test_tricky_texts(text: str) -> None:
    for pattern in PATTERNS:
        assert findall_at(text, "self.", pattern) == pattern.findall(text)


def test_random_texts() -> None:
    pieces = ["self.", "self", ".", "x", "y_", "(", ":", "=", "==", " ", "\n", "my", "é", "1"]
    rng = random.Random(19)
    for _ in range(20_000):
        text = "".join(rng.choice(pieces) for _ in range(rng.randint(0, 12)))
        for pattern in PATTERNS:
            assert findall_at(text, "self.", pattern) == pattern.findall(text), repr(text)


def test_fixtures() -> None:
    for path in sorted(FIXTURES.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        for pattern in PATTERNS:
            assert findall_at(text, "self.", pattern) == pattern.findall(text), path
