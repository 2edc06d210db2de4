"""Trees the project index parsed serve the check of the same file (parsed once)."""

from __future__ import annotations

import ast
import gc

import pytest

from torchdoctor.check import parsed_trees
from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.engine import RunOptions, check_source
from torchdoctor.check.parallel import Task, run_tasks
from torchdoctor.check.registry import rule_classes


@pytest.fixture(autouse=True)
def _empty() -> None:
    parsed_trees.forget()


def test_a_kept_tree_is_taken_once_and_only_for_its_text() -> None:
    tree = ast.parse("x = 1\n")
    parsed_trees.keep("a.py", "x = 1\n", tree)
    assert parsed_trees.take("a.py", "x = 2\n") is None  # another text: parsed anew
    parsed_trees.keep("a.py", "x = 1\n", tree)
    assert parsed_trees.take("a.py", "x = 1\n") is tree
    assert parsed_trees.take("a.py", "x = 1\n") is None  # taken: no longer kept


def test_the_oldest_trees_go_first(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(parsed_trees, "KEPT_CHARACTERS", 10)
    for name in ("a.py", "b.py", "c.py"):
        parsed_trees.keep(name, "y = 22\n", ast.parse("y = 22\n"))
    assert parsed_trees.take("a.py", "y = 22\n") is None
    assert parsed_trees.take("c.py", "y = 22\n") is not None


def test_the_check_takes_the_tree_the_project_index_parsed(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # a class whose device defaults to CUDA: the index parses the file for it
    source = (
        "import torch\n\n"
        "class Net(torch.nn.Module):\n"
        "    def __init__(self, device='cuda'):\n"
        "        super().__init__()\n"
        "        self.w = torch.zeros(2, device=device)\n"
    )
    project = build_project([("net.py", source)])
    rules = list(rule_classes())
    parses: list[str] = []
    original = ast.parse

    def counting(text: str, *args: object, **kwargs: object) -> ast.Module:
        if text == source:
            parses.append(text)
        return original(text, *args, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(ast, "parse", counting)
    kept = check_source(source, "net.py", rules, project)
    assert parses == []
    monkeypatch.setattr(ast, "parse", original)
    parsed_trees.forget()
    assert check_source(source, "net.py", rules, project) == kept


def test_with_a_plan_the_trees_no_check_takes_go_first_then_the_last_checked(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(parsed_trees, "KEPT_CHARACTERS", 21)  # three trees of 7 characters
    for name in ("a.py", "b.py", "c.py", "d.py", "e.py", "f.py"):
        parsed_trees.plan(name)
    text = "y = 22\n"
    assert parsed_trees.take_for_check("b.py", text) is None  # a.py and b.py are checked
    for name in ("f.py", "a.py", "e.py", "x.py"):  # x.py: outside the plan
        parsed_trees.keep(name, text, ast.parse(text))
    assert parsed_trees.take("a.py", text) is None  # checked already: not kept
    parsed_trees.keep("d.py", text, ast.parse(text))
    assert parsed_trees.take("x.py", text) is None  # no check takes it: it went next
    parsed_trees.keep("c.py", text, ast.parse(text))
    assert parsed_trees.take("f.py", text) is None  # of the others, checked last
    for name in ("c.py", "d.py", "e.py"):
        assert parsed_trees.take_for_check(name, text) is not None


def test_a_file_already_checked_keeps_no_tree() -> None:
    for name in ("a.py", "b.py"):
        parsed_trees.plan(name)
    text = "y = 22\n"
    assert parsed_trees.take_for_check("a.py", text) is None
    for name in ("a.py", "b.py", "x.py"):  # x.py: outside the plan
        parsed_trees.keep(name, text, ast.parse(text))
    assert parsed_trees.take("a.py", text) is None  # a sibling read after its check
    assert parsed_trees.take("b.py", text) is not None
    assert parsed_trees.take("x.py", text) is not None


def test_the_files_whose_trees_are_kept_are_checked_first() -> None:
    text = "y = 22\n"
    for name in ("a.py", "b.py", "c.py", "d.py"):
        parsed_trees.plan(name)
    for name in ("d.py", "b.py"):
        parsed_trees.keep(name, text, ast.parse(text))
    assert parsed_trees.checks_first(["a.py", "b.py", "c.py", "d.py", ""]) == [1, 3, 0, 2, 4]
    # the plan follows that order: a.py is checked after d.py, so its tree is kept
    assert parsed_trees.take_for_check("d.py", text) is not None
    parsed_trees.keep("a.py", text, ast.parse(text))
    assert parsed_trees.take("a.py", text) is not None


def test_outcomes_come_in_the_order_of_the_tasks_whatever_the_order_of_checks() -> None:
    texts = [f"x{i} = {i}\n" for i in range(4)]
    paths = [f"m{i}.py" for i in range(4)]
    project = build_project(list(zip(paths, texts, strict=True)))
    parsed_trees.keep(paths[2], texts[2], ast.parse(texts[2]))  # m2.py is checked first
    tasks = [Task(p, t, ("TD101",)) for p, t in zip(paths, texts, strict=True)]
    outcomes = run_tasks(tasks, project, RunOptions(enabled=frozenset({"TD101"})), 1)
    assert [o.text for o in outcomes] == texts


def test_trees_kept_during_a_run_are_frozen_and_only_then() -> None:
    # (the young collection after each file then does not walk a sibling's tree)

    parsed_trees.keep("a.py", "x = 1\n", ast.parse("x = 1\n"))
    assert gc.get_freeze_count() == 0  # outside a run
    parsed_trees.freeze_kept(True)
    try:
        parsed_trees.keep("b.py", "y = 2\n", ast.parse("y = 2\n"))
        assert gc.get_freeze_count() > 0
    finally:
        parsed_trees.freeze_kept(False)
        gc.unfreeze()
    # a run turns it on for its checks only
    source = "import torch\nx = torch.zeros(2).cuda()\n"
    codes = tuple(r.code for r in rule_classes())
    run_tasks(
        [Task("c.py", source, codes)], build_project([source]), RunOptions(frozenset(codes)), 1
    )
    assert not parsed_trees._freeze_kept and gc.get_freeze_count() == 0
