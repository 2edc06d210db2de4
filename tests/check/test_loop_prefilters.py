"""Cheap tests the training-loop rules read first must answer as the work they stand for:
analysis/mode_gate.py rules out only functions the mode interpreter finds no model run and
no training step in; the needle scans answer as the regexes they replace."""

from __future__ import annotations

import ast
from pathlib import Path

from tests.check.rule_fixtures import fixture_contexts
from torchdoctor.check.analysis.file_loops import analysis


def test_gate_never_rules_out_a_function_with_runs_or_steps() -> None:
    ruled_out = with_runs = 0
    for ctx in fixture_contexts([]):
        fl = analysis(ctx)
        for fi in fl.all_functions():
            result = fl.modes(fi)
            if result.forwards or result.steps:
                with_runs += 1
                assert fl.may_run_model(fi), (Path(ctx.path).name, fi.name)
            elif not fl.may_run_model(fi):
                ruled_out += 1
    # the fixtures hold both kinds: the test sees the gate let runs through and skip others
    assert with_runs > 50 and ruled_out > 50


def test_mode_calls_finds_what_the_mode_call_regex_finds() -> None:
    from torchdoctor.check.analysis.grad_contexts import _MODE_CALL
    from torchdoctor.check.analysis.loop_index import mode_calls

    odd = [
        "a.eval()\n3.x.eval()\né.x.eval()\nééé.eval()\na.eval().train()\n1a.eval()\n",
        "x.train(mode=y.eval())\nm._b.c.train( False )\n..eval()\na..b.train(True)\n",
        "x=__.eval()\nab.train(mode = z)\nnet.train(flag)\nnet.train(1 + 2)\n",
    ]
    fixtures = (Path(__file__).parent / "fixtures").rglob("*.py")
    for source in [*odd, *(p.read_text(encoding="utf-8") for p in fixtures)]:
        expected = {(m.group(1), m.group(2)) for m in _MODE_CALL.finditer(source)}
        assert set(mode_calls(source)) == expected


def test_store_line_scan_answers_as_the_store_regex() -> None:
    from torchdoctor.check.rules._kept_by_callers import _STORE, has_store_line

    odd = [
        "  a[b] = c",
        "\n  a[b] = c\r",
        "a[b]=c\n  x[y]\t=\tz # ]= c\n",
        "\r\n\tq[1]=w#\n",
        "  a[b] = c d\n",
        "  a[b]] = c\n",
        "x\n a[b] =c\r\n",
        "  a[b\n] = c\n",
        "  a[b] == c\n",
    ]
    fixtures = (Path(__file__).parent / "fixtures").rglob("*.py")
    for source in [*odd, *(p.read_text(encoding="utf-8") for p in fixtures)]:
        assert has_store_line(source) == (_STORE.search(source) is not None), source[:60]


def test_in_place_text_tests_answer_as_their_regexes() -> None:
    from torchdoctor.check.rules._inplace_text import (
        LEAF_WRITE,
        SAVED_WRITE,
        may_write_leaf,
        may_write_saved,
    )

    odd = ["a_(", "_(", "x]=1", "x] == 1", "x]\n=\n", "a+=1", "A_(", "9_(", "x <<= 2"]
    odd += ["inplace", "a //= 3", "b **= 2", "c >>= 1", "d %= 2", "]\n==", "]=", "__init__("]
    fixtures = (Path(__file__).parent / "fixtures").rglob("*.py")
    texts = [*odd]
    for path in fixtures:
        texts += path.read_text(encoding="utf-8").split("\n    def ")
    for text in texts:
        assert may_write_leaf(text) == (LEAF_WRITE.search(text) is not None), text[:60]
        assert may_write_saved(text) == (SAVED_WRITE.search(text) is not None), text[:60]


def test_td215_leaves_out_only_methods_whose_walk_finds_nothing() -> None:
    """TD215's `_may_matter` skips a method only where `_Method` finds no returned grad
    value and no in-place write of a saved tensor (walked here with every method of
    the class taken to return one: the most a summary pass can know)."""
    from torchdoctor.check.rules.td215_inplace_on_saved_tensor import (
        InplaceOnSavedTensor,
        _may_matter,
        _Method,
        _State,
    )

    skipped = kept = 0
    for ctx in fixture_contexts([]):
        rule = InplaceOnSavedTensor(ctx)
        for cls in [n for n in ast.walk(ctx.tree) if isinstance(n, ast.ClassDef)]:
            layers = rule._layers(ctx, cls)
            methods = [m for m in cls.body if isinstance(m, ast.FunctionDef)]
            every = {m.name for m in methods}
            for method in methods:
                if _may_matter(ctx, method, True, layers):
                    kept += 1
                    continue
                skipped += 1
                found: list[tuple[ast.AST, str, str]] = []
                walker = _Method(rule, ctx, layers, set(every), found)
                walker.block(method.body, _State(), False)
                assert not walker.returns_grad and not found, (Path(ctx.path).name, method.name)
    assert skipped > 50 and kept > 50


def test_call_fact_gate_rules_out_only_functions_that_send_no_fact() -> None:
    from torchdoctor.check.analysis.file_flow import file_flow
    from torchdoctor.check.analysis.project_facts import _Sender

    ruled_out = sending = 0
    for ctx in fixture_contexts([]):
        for methods_only in (False, True):
            sender = _Sender(ctx, methods_only)
            ff = file_flow(ctx)
            for func in ff.functions():
                sends = any(True for _ in sender.facts(ff.scope(func)))
                if sends:
                    sending += 1
                    assert sender.may(func), func.name
                elif not sender.may(func):
                    ruled_out += 1
    # the fixtures hold both kinds: the gate lets senders through and skips others
    assert sending > 5 and ruled_out > 50, (sending, ruled_out)
