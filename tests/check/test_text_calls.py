"""`text_calls.writes_call` answers as `CALLED_NAME.findall`, the pattern it replaces
for speed in `ProjectIndex.wrapped_arguments_for`."""

from __future__ import annotations

from tests.check._text_samples import fixture_texts, random_texts
from torchdoctor.check.context import words_of
from torchdoctor.check.text_calls import CALLED_NAME, writes_call

NAMES = ["f", "foo", "xfoo", "_f", "f3", "3f", "éf", "fé", "a.f", "", "f(", "oo"]


def _check(text: str, names: list[str]) -> None:
    called = set(CALLED_NAME.findall(text))
    for name in names:
        assert writes_call(text, name) == (name in called), (text, name)


def test_random_texts() -> None:
    pieces = ["f", "foo", "x", "3", "é", "_", " ", "\n", "\u3000", "(", ".", "o", "=", "\t"]
    for text in random_texts(pieces, seed=5, longest=10):
        _check(text, NAMES)


def test_fixture_texts() -> None:
    for _path, text in fixture_texts():
        _check(text, [*NAMES, *words_of(text)])
