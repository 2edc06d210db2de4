"""`td.explain` / `torchdoctor explain` never raise, whatever they are given.

Latency (< 10 ms per message) is measured by `benchmarks/explain_latency.py`, not here:
the suite makes no timed assertions.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import torchdoctor as td
from torchdoctor.explain import kb

EXAMPLES = [example for entry in kb.entries() for example in entry.examples]
fuzz = settings(max_examples=150, deadline=None, database=None)


def _explain_fully(subject: BaseException | str) -> td.Explanation:
    """Explain and render every way a user can: str(), as_dict() as JSON."""
    explanation = td.explain(subject)
    assert isinstance(str(explanation), str)
    json.dumps(explanation.as_dict())
    return explanation


@fuzz
@given(st.text())
def test_never_raises_on_any_text(text: str) -> None:
    if text:
        _explain_fully(text)


@fuzz
@given(
    st.sampled_from(EXAMPLES),
    st.text(max_size=200),
    st.text(max_size=200),
    st.integers(min_value=0, max_value=400),
)
def test_never_raises_on_damaged_real_messages(
    example: str, before: str, inserted: str, cut: int
) -> None:
    # real wordings, cut, wrapped and spliced with noise: the paths that match go deep
    damaged = before + example[:cut] + inserted + example[cut:]
    _explain_fully(damaged)
    _explain_fully(f'Traceback (most recent call last):\n  File "{before}", line 1\n{damaged}')


@pytest.mark.parametrize(
    "unit",
    [
        "a",
        "_",
        "1",
        " ",
        ".",
        ":",
        "'",
        "(",
        "\n",
        "cuda:0 ",
        "torch.",
        "Tensor",
        "[1, ",
        '  File "a.py", line 1, in f\n    x = y\n',
        "Expected all tensors ",
    ],
)
def test_long_repetitive_messages_finish(unit: str) -> None:
    # 100 KB of one pattern: a regular expression that backtracks quadratically would
    # never finish here (one did: `(?P<op>\w+)\(\): ...` on a long word)
    _explain_fully("RuntimeError: " + unit * (100_000 // len(unit)))


class _UnprintableError(Exception):
    def __str__(self) -> str:
        raise RuntimeError("__str__ is broken too")


def _raised(exc: BaseException) -> BaseException:
    try:
        raise exc
    except BaseException as caught:
        return caught


def _cyclic() -> BaseException:
    first = RuntimeError(
        "Expected all tensors to be on the same device, but found at "
        "least two devices, cuda:0 and cpu!"
    )
    second = ValueError("while handling")
    first.__context__, second.__context__ = second, first
    return first


@pytest.mark.parametrize(
    "exc",
    [
        _UnprintableError(),
        _raised(_UnprintableError()),
        _cyclic(),
        KeyboardInterrupt(),
        SystemExit(3),
        Exception(object(), 5, None),
        _raised(RuntimeError("x" * 1_000_000)),
        _raised(RecursionError("maximum recursion depth exceeded")),
    ],
    ids=[
        "unprintable",
        "unprintable-raised",
        "cycle",
        "keyboard",
        "exit",
        "odd-args",
        "huge",
        "recursion",
    ],
)
def test_never_raises_on_odd_exceptions(exc: BaseException) -> None:
    explanation = _explain_fully(exc)
    assert type(exc).__name__ in explanation.message


def test_the_cli_takes_any_bytes_on_stdin() -> None:
    noise = bytes(range(256)) * 64 + b"\xff\xfe\n" + EXAMPLES[0].encode() + b"\n\x00"
    for data in (noise, b"", b"\n" * 1000, "é—€\u2028".encode() * 100):
        proc = subprocess.run(
            [sys.executable, "-m", "torchdoctor", "explain", "-"],
            input=data,
            capture_output=True,
            timeout=120,
        )
        assert proc.returncode in (0, 1, 2), proc.stderr
        assert b"Traceback" not in proc.stderr, proc.stderr


def test_td_explain_stays_the_function_after_its_subpackage_is_imported() -> None:
    # td.diagnose imports the `torchdoctor.explain` subpackage, which used to replace
    # the package attribute `explain`: td.explain(...) then failed as "module not callable"
    script = (
        "import torchdoctor as td\n"
        "td.diagnose\n"
        "import torchdoctor.explain.hooks\n"
        "from torchdoctor.explain import kb\n"
        "print(td.explain('Expected all tensors to be on the same device, but found at "
        "least two devices, cuda:0 and cpu!').code, len(kb.entries()) > 0)\n"
    )
    proc = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["TD112", "True"]
