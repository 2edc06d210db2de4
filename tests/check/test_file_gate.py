"""The per-file gates of check/rules/_file_gate.py must never hide a reportable name."""

from __future__ import annotations

import ast

from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.context import FileContext
from torchdoctor.check.engine import check_source
from torchdoctor.check.registry import rules_by_code
from torchdoctor.check.rules._file_gate import has_word, skip_visits, words_starting_with


def test_has_word_finds_whole_words_only() -> None:
    assert has_word("torch.save(model, path)", "save")
    assert has_word("save", "save")
    assert has_word("from torch import save as torch_save", "save")
    assert not has_word("ctx.save_for_backward(x); saved = autosave", "save")
    assert not has_word("_save(x) or save2(x) or résave", "save")


def test_words_starting_with_any_case() -> None:
    source = "p.Requires_Grad = 1; REQUIRE_GRAD; x.require_grads; prerequisite"
    words = words_starting_with(source, "req")
    assert {"Requires_Grad", "REQUIRE_GRAD", "require_grads"} <= words
    # a character that grows in lower case ("İ" -> "i̇") shifts every later position
    assert "require_grad" in words_starting_with("İ = 1\nx.require_grad = 0", "req")


def test_skip_visits_narrows_one_instance_only() -> None:
    rule_class = rules_by_code()["TD101"]
    # (a file that says "cuda": TD101's own gate leaves every node type on)
    source = 'x = "cuda"\n'
    ctx = FileContext("m.py", source, ast.parse(source), build_project([]))
    rule = rule_class(ctx)
    skip_visits(rule, keep=(ast.Call,))
    assert rule.node_types == (ast.Call,)
    assert ast.Assign in rule_class.node_types


def test_gated_rules_still_report_through_aliases() -> None:
    source = (
        "from torch import load as torch_load, save as torch_save\n"
        "import torch.nn as nn\n"
        "model = nn.Linear(2, 2)\n"
        "torch_save(model, 'm.pt')\n"
        "state = torch_load('pretrained.pt')\n"
        "w = nn.Parameter(state['w'])\n"
        "w.Requires_Grad = False\n"
        "model.cuda()\n"
        "gpu = torch.cuda.is_available()\n"  # meant to run without a GPU: TD101, not TD115
    )
    rules = [rules_by_code()[code] for code in ("TD101", "TD208", "TD401", "TD402")]
    found = {(f.code, f.line) for f in check_source(source, "train.py", rules)}
    assert found == {("TD401", 4), ("TD402", 5), ("TD208", 7), ("TD101", 8)}
