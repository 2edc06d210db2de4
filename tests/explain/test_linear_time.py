"""Every knowledge-base pattern runs in time linear in its input (issue 21: a backtracking
pattern took 91 s on a 1 MB log).

Each pattern is run on 1 MB adversarial inputs: near-misses of many patterns repeated (a
backtracking engine retries them from every position) and, per entry, the start of its own
example message repeated. The bound is a "does not blow up" guard, not a timing goal: 100
times what a trivial scan of the same input costs, measured here in the same process.
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import re2

from torchdoctor.explain import kb
from torchdoctor.explain.explainer import strip_ansi

SIZE = 1_000_000
UNITS = (
    "a",
    " ",
    "Weights only load failed. ",
    "Weights only load failed. Unsupported global: GLOBAL a.",
    "DataLoader worker (pid 1) is killed by signal: ",
    "Expected tensor for argument #1 'input' to have the same device as tensor ",
    "NCCL error in: /a.cpp:1",
    "Input type (torch.cuda.",
    "in method wrapper_CUDA_aaa torch.aaa cuda:0 \x1b[1",
)
PATTERNS = [
    (f"{entry.id}: {pattern.pattern}", pattern)
    for entry in kb.entries()
    for pattern in (*entry.patterns, *(c.when for c in entry.causes if c.when is not None))
]


def _fill(unit: str) -> str:
    return (unit * (SIZE // len(unit) + 1))[:SIZE]


def _seconds(call: Callable[[], object]) -> float:
    started = time.perf_counter()
    call()
    return time.perf_counter() - started


def _linear_baseline(text: str) -> float:
    """A scan that must look at every character, in both engines: the unit of the bound."""
    scans = (re2.compile(r"(?i)\d+z"), re.compile(r"\d+z"))
    return max(min(_seconds(lambda p=p: p.search(text)) for _ in range(3)) for p in scans)


def test_every_pattern_is_linear_on_shared_adversarial_inputs() -> None:
    slow = []
    for unit in UNITS:
        text = _fill(unit)
        bound = 100 * _linear_baseline(text) + 0.05
        for name, pattern in PATTERNS:
            took = _seconds(lambda p=pattern, t=text: p.search(t))
            if took > bound:
                slow.append(f"{name} on {unit!r}*: {took:.2f} s > {bound:.2f} s")
    assert not slow


def test_every_pattern_is_linear_on_its_own_near_misses() -> None:
    slow = []
    bound = 100 * _linear_baseline(_fill("Expected tensor for argument #1 'in")) + 0.05
    for entry in kb.entries():
        # the message's start without its last character: almost a match, everywhere
        text = _fill(entry.examples[0][:60][:-1] + " ")
        for pattern in (*entry.patterns, *(c.when for c in entry.causes if c.when is not None)):
            took = _seconds(lambda p=pattern, t=text: p.search(t))
            if took > bound:
                slow.append(f"{entry.id}: {pattern.pattern}: {took:.2f} s > {bound:.2f} s")
    assert not slow


def test_message_facts_and_ansi_stripping_are_linear() -> None:
    for unit in UNITS:
        text = _fill(unit)
        bound = 100 * _linear_baseline(text) + 0.05
        assert _seconds(lambda t=text: kb.message_facts(t)) < bound, unit
        assert _seconds(lambda t=text: strip_ansi(t)) < bound, unit


def test_patterns_are_re2_so_backtracking_cannot_come_back() -> None:
    # RE2 refuses what needs backtracking (lookarounds, backreferences) when the KB loads
    assert all(type(pattern).__module__.startswith("re2") for _, pattern in PATTERNS)
    assert kb.compile_pattern(r"Weights only load failed[\s\S]*GLOBAL (\w+)").search(
        "Weights only load failed. ... GLOBAL posix.system"
    )


def test_one_pass_prefilter_finds_exactly_the_entries_whose_patterns_match() -> None:
    texts = [example for entry in kb.entries() for example in entry.examples]
    texts += [_fill(unit)[:5000] for unit in UNITS]
    for text in texts:
        matching = {entry.id for entry in kb.entries() if entry.search(text)}
        assert {entry.id for entry in kb._candidates(text)} == matching, text[:80]


def test_the_one_pass_prefilter_is_linear() -> None:
    for unit in UNITS:
        text = _fill(unit)
        bound = 100 * _linear_baseline(text) + 0.05
        assert _seconds(lambda t=text: kb._candidates(t)) < bound, unit
