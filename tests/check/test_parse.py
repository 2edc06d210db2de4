"""Big modules are parsed piece by piece (lower peak memory) into the tree ast.parse gives."""

from __future__ import annotations

import ast
import sysconfig
import tracemalloc
from pathlib import Path

import hypothesmith
import pytest
from hypothesis import HealthCheck, given, settings

from torchdoctor.check import parse
from torchdoctor.check.parse import parse_module


def _dump(tree: ast.AST) -> str:
    return ast.dump(tree, include_attributes=True)


@pytest.fixture
def small_pieces(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cut every module, however small, into pieces of a few hundred bytes."""
    monkeypatch.setattr(parse, "CHUNKED_FROM_BYTES", 0)
    monkeypatch.setattr(parse, "PIECE_BYTES", 300)


def _stdlib_sample() -> list[Path]:
    root = Path(sysconfig.get_paths()["stdlib"])
    return sorted(p for p in root.glob("*.py"))[::12]


@pytest.mark.usefixtures("small_pieces")
def test_real_modules_give_the_same_tree_as_ast_parse() -> None:
    pieced = 0
    for path in _stdlib_sample():
        source = path.read_text(encoding="utf-8", errors="replace")
        try:
            expected = ast.parse(source)
        except SyntaxError:
            continue
        assert _dump(parse_module(source, str(path))) == _dump(expected), path
        pieced += len(parse._pieces(source)) > 1
    assert pieced > 10  # the sample really was cut


@pytest.mark.usefixtures("small_pieces")
@pytest.mark.parametrize(
    "source",
    [
        # cuts that fall inside a string, brackets, a continuation or a decorator stack
        "x = '''\n" + "a" * 400 + "\ndef inside_a_string():\n    pass\n'''\n",
        "x = (a\n" + "    + 1\n" * 100 + "@ b)\n\ndef after(): pass\n",  # `@` is also matmul
        "x = 1 + \\\n" + "    1 + \\\n" * 100 + "    1\n\ndef after(): pass\n",
        "import a\n" * 60 + "@decorator\n@another(1)\ndef decorated():\n    pass\n" * 10,
        "class A:\n" + "    x = 1\n" * 80 + "class B(A):\n    pass\n",
        "if True:\n" + "    y = 2\n" * 80 + "def f():\n    return 1\nelse_ = 3\n",
        "x = 1\n" * 80 + "async def g():\n    await h()\n" + "y = 2\n" * 80 + "def k(): pass\n",
    ],
)
def test_false_cuts_fall_back_to_the_whole_module(source: str) -> None:
    assert _dump(parse_module(source)) == _dump(ast.parse(source))


@pytest.mark.usefixtures("small_pieces")
def test_syntax_errors_are_reported_where_ast_parse_reports_them() -> None:
    source = "x = 1\n" * 80 + "def f(:\n    pass\n" + "y = 2\n" * 80 + "def g(): pass\n"
    with pytest.raises(SyntaxError) as expected:
        ast.parse(source)
    with pytest.raises(SyntaxError) as got:
        parse_module(source)
    assert (got.value.lineno, got.value.offset, got.value.msg) == (
        expected.value.lineno,
        expected.value.offset,
        expected.value.msg,
    )


@settings(
    max_examples=15,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(hypothesmith.from_grammar())
def test_generated_modules_give_the_same_tree(small_pieces: None, source: str) -> None:
    try:
        expected = _dump(ast.parse(source))
    except (SyntaxError, ValueError):
        return
    assert _dump(parse_module(source)) == expected


def _peak(parse_function: object, source: str) -> int:
    assert callable(parse_function)
    tracemalloc.start()
    try:
        tree = parse_function(source)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    del tree
    return peak


def test_a_big_module_is_parsed_with_a_lower_peak(monkeypatch: pytest.MonkeyPatch) -> None:
    # the mechanism at a smaller scale: 150 KB in 10 KB pieces (the defaults: MBs, 256 KB)
    monkeypatch.setattr(parse, "CHUNKED_FROM_BYTES", 100_000)
    monkeypatch.setattr(parse, "PIECE_BYTES", 10_000)
    block = "def step_{0}(model, batch):\n    out = model(batch[{0}])\n    return out.sum()\n\n\n"
    source = "".join(block.format(i) for i in range(2_000))
    assert len(source) > 150_000
    one_shot, pieced = _peak(ast.parse, source), _peak(parse_module, source)
    # the one-shot parse holds the C parser's tree and the Python tree at once
    assert pieced < 0.7 * one_shot, (pieced / len(source), one_shot / len(source))
