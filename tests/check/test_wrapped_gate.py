"""`wrapped._find` looks for a statement `_wrapped` accepts before its text gate: it
must give what the text gate and the statements' own reading give."""

from __future__ import annotations

import ast

from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.analysis.wrapped import _find, _find_wrapped
from torchdoctor.check.context import FileContext

from ._text_samples import fixture_texts

_WRAPPING = """
import functools
from functools import lru_cache as lc
from cachetools import cached, LRUCache

def f(x):
    return x

def g(x):
    return x

fast = functools.lru_cache(f)
slow = cached(LRUCache(2))(g)
other = lc(f)
log = print(f)
"""


def test_wrapped_functions_gate_answers_as_the_text_gate() -> None:
    texts = [text for _, text in fixture_texts()]
    texts += [_WRAPPING, _WRAPPING.replace("lru_cache(f)", "lru_cache (f)")]
    found = 0
    for text in texts:
        try:
            tree = ast.parse(text)
        except SyntaxError:
            continue
        ctx = FileContext("x.py", text, tree, build_project([text]))
        assert _find(ctx) == _find_wrapped(ctx)
        found += bool(_find(ctx))
    assert found >= 2
