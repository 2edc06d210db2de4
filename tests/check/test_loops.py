"""The shared training-loop analysis: names, events, paths, modes through calls."""

from __future__ import annotations

import ast
import textwrap
from pathlib import Path

import pytest

from torchdoctor.check.analysis.events import (
    BACKWARD,
    CALL,
    CLIP,
    SCALER_STEP,
    SCALER_UPDATE,
    UNSCALE,
    ZERO,
    can_follow,
    counter_condition,
    is_accumulation,
    same_path,
    unconditional_in,
)
from torchdoctor.check.analysis.file_loops import FileLoops, analysis
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.mode_state import ENTRY, EVAL
from torchdoctor.check.analysis.names import is_eval_iterable, is_eval_name
from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.context import FileContext
from torchdoctor.check.engine import check_source
from torchdoctor.check.registry import rules_by_code

MY_RULES = [
    "TD201",
    "TD202",
    "TD203",
    "TD204",
    "TD205",
    "TD206",
    "TD213",
    "TD214",
    "TD301",
    "TD302",
    "TD404",
    "TD501",
    "TD502",
    "TD605",
    "TD606",
]


def file_loops(source: str, path: str = "train.py") -> FileLoops:
    source = textwrap.dedent(source)
    ctx = FileContext(path, source, ast.parse(source), build_project([source]))
    return analysis(ctx)


def function(fl: FileLoops, name: str) -> FunctionInfo:
    return next(fi for fi in fl.functions if fi.name == name)


# -- names -------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("evaluate", True),
        ("validate", True),
        ("run_validation", True),
        ("valEpoch", True),
        ("test", True),
        ("test_epoch", True),
        ("predict", True),
        ("generate", True),
        ("generate_text", True),
        ("test_conv_eval", False),  # a unit test
        ("validation_step", False),  # Lightning handles it
        ("training_step", False),
        ("train_and_evaluate", False),
        ("generate_inputs", False),
        ("get_val_loader", False),
        ("forward", False),
    ],
)
def test_eval_names(name: str, expected: bool) -> None:
    assert is_eval_name(name) is expected


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("val_loader", True),
        ("tqdm(test_dataloader)", True),
        ("enumerate(data_loader_val)", True),
        ("dataloaders['valid']", True),
        ("train_loader", False),
        ("range(10)", False),
        ("['train', 'val']", False),
    ],
)
def test_eval_iterables(text: str, expected: bool) -> None:
    assert is_eval_iterable(text) is expected


def test_model_keys_are_objects_not_classes_or_builders() -> None:
    fl = file_loops(
        """
        import torch
        def get_model(): ...
        class LinearClassifier: ...
        net = LinearClassifier()
        writer = None
        """
    )
    assert fl.is_model_key("model")
    assert fl.is_model_key("self.encoder")
    assert fl.is_model_key("netG")
    assert not fl.is_model_key("get_model")  # a function of this file
    assert not fl.is_model_key("LinearClassifier")
    assert not fl.is_model_key("torch.Generator")  # an imported module's attribute
    assert not fl.is_model_key("writer.generator")
    assert not fl.is_model_key("criterion")


# -- events and paths ----------------------------------------------------------------------
def test_events_in_program_order_with_their_loops_and_branches() -> None:
    fl = file_loops(
        """
        def train(model, loader, optimizer, scaler, accum):
            for i, (x, y) in enumerate(loader):
                with torch.autocast("cuda"):
                    loss = model(x)
                scaler.scale(loss / accum).backward()
                if (i + 1) % accum == 0:
                    scaler.unscale_(optimizer)
                    torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
                    scaler.step(optimizer)
                    scaler.update()
                    optimizer.zero_grad(set_to_none=True)
        """
    )
    events = [e for e in fl.events(function(fl, "train")) if e.kind != CALL]
    assert [e.kind for e in events] == [
        BACKWARD,
        UNSCALE,
        CLIP,
        SCALER_STEP,
        SCALER_UPDATE,
        ZERO,
    ]
    backward, _, _, step, _, zero = events
    assert backward.scaler == "scaler" and ast.unparse(backward.expr) == "loss / accum"
    assert backward.autocast is None  # the backward is after the `with` block
    assert step.target == "optimizer" and zero.subject == "optimizer"
    loop = backward.loops()[0]
    assert unconditional_in(backward, loop) and not unconditional_in(step, loop)
    counter = counter_condition(step, loop)
    assert counter is not None and ast.unparse(counter.right) == "accum"
    assert is_accumulation(events, step, loop)
    assert can_follow(backward, step) and not can_follow(step, backward)


def test_paths_exclude_other_branches_and_code_after_continue() -> None:
    fl = file_loops(
        """
        def train(model, loader, optimizer, use_amp):
            for x in loader:
                loss = model(x)
                if use_amp:
                    scaler.scale(loss).backward()
                else:
                    loss.backward()
                if not torch.isfinite(loss):
                    optimizer.zero_grad()
                    continue
                optimizer.step()
        """
    )
    scaled, plain, zero, step = [e for e in fl.events(function(fl, "train")) if e.kind != CALL]
    assert not same_path(scaled, plain)
    assert can_follow(scaled, step) and can_follow(plain, step)
    assert can_follow(plain, zero)
    assert not can_follow(zero, step)  # `continue` ends that branch


def test_backward_inside_a_named_autocast_context() -> None:
    fl = file_loops(
        """
        ctx = nullcontext() if device == "cpu" else torch.amp.autocast(device_type=device)
        with ctx:
            loss = model(x)
            loss.backward()
        with torch.autocast("cuda", enabled=False):
            other.backward()
        """
    )
    backwards = [e for e in fl.events(fl.module) if e.kind == BACKWARD]
    assert [e.autocast is not None for e in backwards] == [True, False]


# -- modes ------------------------------------------------------------------------------------
def test_summary_of_a_function_that_sets_eval_mode() -> None:
    fl = file_loops(
        """
        def evaluate(model, loader):
            model.eval()
            with torch.no_grad():
                for x, y in loader:
                    model(x)
        """
    )
    summary = fl.summary(function(fl, "evaluate"))
    assert summary is not None
    assert {o.mode for o in summary.exit["model"]} == {EVAL}
    assert summary.evals == {}  # it runs `model` in a mode it chose itself


def test_modes_follow_calls_and_loops() -> None:
    fl = file_loops(
        """
        def train_one_epoch(net, loader, optimizer):
            for x, y in loader:
                optimizer.zero_grad()
                net(x).sum().backward()
                optimizer.step()

        def validate(net, loader):
            net.eval()
            for x, y in loader:
                net(x)

        def main(model, train_loader, val_loader, optimizer):
            for epoch in range(10):
                train_one_epoch(model, train_loader, optimizer)
                validate(model, val_loader)
        """
    )
    summary = fl.summary(function(fl, "train_one_epoch"))
    assert summary is not None and "net" in summary.trains  # trains in the caller's mode
    result = fl.modes(function(fl, "main"))
    (step,) = result.steps
    assert step.key == "model"
    modes = {o.mode: o for o in step.origins}
    assert set(modes) == {ENTRY, EVAL}  # first epoch / later epochs
    assert "validate()" in modes[EVAL].what and modes[EVAL].line == 16


def test_none_checks_prune_the_path_where_a_model_is_absent() -> None:
    fl = file_loops(
        """
        def validate(encoder, decoder, loader):
            decoder.eval()
            if encoder is not None:
                encoder.eval()
            for x in loader:
                if encoder is not None:
                    x = encoder(x)
                decoder(x)
        """
    )
    forwards = {fc.key: fc for fc in fl.modes(function(fl, "validate")).forwards}
    assert {o.mode for o in forwards["encoder"].origins} == {EVAL}
    assert {o.mode for o in forwards["decoder"].origins} == {EVAL}


def test_deeply_nested_code_stops_at_the_budget() -> None:
    body = "model.eval()\n"
    for depth in range(14):
        body = f"for i{depth} in range(2):\n" + textwrap.indent(body + "model.train()\n", "    ")
    fl = file_loops("def f(model):\n" + textwrap.indent(body, "    "))
    result = fl.modes(function(fl, "f"))
    assert result.budget_exceeded
    summary = result.summary()
    assert summary.evals == {} and summary.trains == {}


def test_train_eval_mode_sensitivity_of_classes() -> None:
    fl = file_loops(
        """
        import torch.nn as nn
        from blocks import Block

        class Plain(nn.Module):
            def __init__(self):
                super().__init__()
                self.fc = nn.Linear(4, 2)

        class WithDropout(Plain):
            def __init__(self):
                super().__init__()
                self.drop = nn.Dropout(0.1)

        class Child(Plain):
            pass

        class Unknown(nn.Module):
            def __init__(self):
                super().__init__()
                self.block = Block()

        model = Plain()
        """
    )
    assert fl.class_mode_sensitive("Plain") is False
    assert fl.class_mode_sensitive("WithDropout") is True
    assert fl.class_mode_sensitive("Child") is False
    assert fl.class_mode_sensitive("Unknown") is None  # `Block` may have Dropout
    assert fl.key_mode_sensitive("model") is False


def test_calls_resolve_into_sibling_files(tmp_path: Path) -> None:
    (tmp_path / "engine.py").write_text(
        "def evaluate(model, loader):\n    model.eval()\n    return [model(x) for x in loader]\n"
    )
    source = "from engine import evaluate\nimport engine\nevaluate(m, l)\nengine.evaluate(m, l)\n"
    fl = file_loops(source, path=str(tmp_path / "main.py"))
    calls = [s.value for s in fl.ctx.tree.body if isinstance(s, ast.Expr)]
    for call in calls:
        assert isinstance(call, ast.Call)
        resolved = fl.resolve(fl.module, call)
        assert resolved is not None
        callee, as_method = resolved
        assert callee.name == "evaluate" and not as_method
        assert callee.file.ctx.path.endswith("engine.py")


def test_a_sibling_is_read_again_for_another_project(tmp_path: Path) -> None:
    """A sibling analysed for one run's project is not reused by a run over another
    (an editor server checks many projects in one process): its facts are per project."""
    (tmp_path / "engine.py").write_text("def evaluate(model):\n    model.eval()\n")
    source = "from engine import evaluate\nevaluate(m)\n"
    first = file_loops(source, path=str(tmp_path / "main.py"))
    second = file_loops(source, path=str(tmp_path / "main.py"))
    assert first.ctx.project is not second.ctx.project
    siblings = []
    for fl in (first, second):
        call = fl.ctx.tree.body[1].value
        assert isinstance(call, ast.Call)
        resolved = fl.resolve(fl.module, call)
        assert resolved is not None
        siblings.append(resolved[0].file)
    assert siblings[0].ctx.project is first.ctx.project
    assert siblings[1].ctx.project is second.ctx.project
    # within one project the analysed sibling is shared
    again = second.resolve(second.module, second.ctx.tree.body[1].value)  # type: ignore[arg-type]
    assert again is not None and again[0].file is siblings[1]


# -- robustness --------------------------------------------------------------------------------
ODD_CODE = """
import torch
async def train(model, loader, optimizer, scaler):
    async for x in loader:
        match x:
            case {"img": img}:
                (loss := model(img)).backward()
            case _:
                pass
        try:
            optimizer.step()
        except* ValueError:
            optimizer.zero_grad()
        finally:
            scaler.update()
    lam = lambda: model.eval()
    [model(v) for v in loader if v]
    while True:
        break
    else:
        model.train(mode)
    del model.grad
    global g
    return model.eval().train(False)

for _ in range(0): pass
with torch.no_grad(), torch.autocast("cuda") as ac, open("f") as f:
    pass
"""


@pytest.mark.parametrize("source", ["", "x = 1\n", ODD_CODE])
def test_rules_never_crash_on_unusual_code(source: str) -> None:
    rules = [rules_by_code()[code] for code in MY_RULES]
    findings = check_source(source, "odd.py", rules)
    assert [f for f in findings if f.code in ("TD900", "TD001")] == []
