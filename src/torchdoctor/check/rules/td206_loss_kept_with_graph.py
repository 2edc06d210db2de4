from __future__ import annotations

import ast
import functools
import re
from collections.abc import Callable
from typing import TYPE_CHECKING, ClassVar

from torchdoctor.check.analysis.events import BACKWARD, Event
from torchdoctor.check.analysis.file_flow import file_flow
from torchdoctor.check.analysis.file_loops import FileLoops, analysis
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.grad_contexts import with_item_context
from torchdoctor.check.analysis.graph_flow import graph_passing_parameter
from torchdoctor.check.analysis.kept_state import kept_arguments
from torchdoctor.check.analysis.names import is_torch_file
from torchdoctor.check.analysis.syntax import bound_names, dotted
from torchdoctor.check.analysis.values import Kind
from torchdoctor.check.lines import line_end
from torchdoctor.check.rule import Fix, FixAvailability, Rule, Severity
from torchdoctor.check.rules._accumulations import (
    accumulations,
    plain_number_accumulator,
    reset_inside,
)
from torchdoctor.check.rules._kept_by_callers import report_kept_for_callers
from torchdoctor.check.tree_walk import iter_children, walk

if TYPE_CHECKING:
    from torchdoctor.check.context import FileContext

# Calls that give a plain number or a graph-free tensor.
_DETACHING = frozenset({"item", "detach", "tolist", "numpy", "float", "int", "data", "cpu"})


class LossKeptWithGraph(Rule):
    """A loss is summed or collected across iterations together with its autograd graph.

    ## What it does
    Finds accumulations across loop iterations -- `total += loss`,
    `running_loss = running_loss + loss`, `losses.append(loss)`,
    `total += loss * x.size(0)` -- of a value that carries an autograd graph: the
    tensor given to `backward()` in that loop (or any tensor the dataflow knows
    requires grad), with no `.item()`, `.detach()` or `float()` around it. The
    accumulator must outlive the iteration (defined before the loop) and must not
    itself be given to `backward()` later (summing losses on purpose to call
    `backward()` once is fine). A sum made inside `with torch.no_grad():` has no
    graph and is left alone; an `append(loss)` there still keeps the loss's graph.

    An object of the project's own classes counts as an accumulator when the method
    called adds its argument up in the object's state (`meter.update(loss)` where
    `update` does `self.sum += val`, looked up in the class's file). A method that
    runs `backward()` is a training step, run once per batch: what it adds up into
    `self` (`self.losses.update([l1, l2])`, `self.total += loss`) outlives the call
    just as an accumulator defined before a loop does. Besides the loss and its
    parts, values from the same forward pass count (`out, attn = model(x)` with
    `loss = criterion(out, y)`: `attn`), also through a function of the project
    that returns a differentiable transform of them (`attn.max(dim=1)[0].mean()`).

    A training step may be split across methods: a method that stores the loss it
    returns into an object it is given that keeps every value (`stats["loss"] = loss`,
    where the class's `__setitem__` appends it; the class from the parameter's annotation
    or its docstring's `:type stats:` field) is reported when a method of its class
    family (another file too) passes it an object of its own state (`self.stats`) and
    runs `backward()` on the returned loss.

    ## Why is this bad?
    `total += loss` makes `total` a tensor whose `grad_fn` links to this step's
    graph and to every earlier step's: nothing from any iteration can be freed.
    `backward()` releases the saved activations, but the graph nodes, the loss
    tensors and the chain of additions stay. Measured on a 2-layer MLP: about 6 KB
    (8 graph nodes) retained per step, 12 MB after 2,000 steps; a transformer step
    with thousands of graph nodes retains megabytes per step, so a long run slowly
    runs out of memory. Where no `backward()` ever runs (an evaluation loop without
    `no_grad`) every batch's activations stay too: 1.25 GB per batch for a
    VGG-11-BN at batch 16 (224x224). The sum is also a tensor that requires grad, so later
    `.numpy()` or logging code breaks.

    ## Example
    ```python
    running_loss = 0.0
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        running_loss += loss
    ```

    ## Use instead
    ```python
    running_loss = 0.0
    for x, y in loader:
        loss = criterion(model(x), y)
        loss.backward()
        optimizer.step()
        running_loss += loss.item()  # or loss.detach() to avoid a device sync per step
    ```

    ## Fix safety
    For `total += loss` the fix writes `total += loss.item()`. It is safe when
    `total` starts as a plain number and the code never uses it as a tensor (no
    `total.item()`, `total.cpu()`, ...); otherwise the fix is offered as unsafe,
    since `total` becomes a Python float.

    ## References
    - https://pytorch.org/docs/stable/notes/faq.html#my-model-reports-cuda-runtime-error-2-out-of-memory
    """

    code = "TD206"
    name = "loss-kept-with-graph"
    category = "training"
    severity = Severity.WARNING
    fix_availability = FixAvailability.SAFE
    # `] =`: a method that stores the loss its callers backward() (_kept_by_callers)
    triggers: ClassVar[tuple[str, ...]] = ("backward", "] =")

    _following: set[str]

    def finish(self) -> None:
        self._following = set()
        if not is_torch_file(self.ctx.source):
            return
        report_kept_for_callers(self)
        if "backward" not in self.ctx.source:
            return
        fl = analysis(self.ctx)
        helpers: bool | None = None  # asked only of a function without a backward( call
        objects = bool(self.ctx.project.class_files) or "class " in self.ctx.source
        for fi in fl.all_functions():
            may = _may_accumulate_a_loss(fi.text, objects or fi.cls is not None)
            if may is None:
                if helpers is None:
                    helpers = any(fl.backward_params(g) for g in fl.all_functions())
                may = helpers
            if not may:
                continue
            events = [e for e in fl.events(fi) if e.kind == BACKWARD and e.expr is not None]
            if not events:
                continue
            loops: dict[int, ast.AST] = {}
            for e in events:
                for loop in e.loops():
                    loops[id(loop)] = loop
            backed = _backward_names(events)
            reported: set[int] = set()
            kept = functools.partial(kept_arguments, self.ctx, fi) if objects else None
            for loop in loops.values():
                graph = {name for e in events if e.in_loop(loop) for name in _loss_names(e)}
                if not graph:
                    continue
                graph |= _parts_of(loop, graph) | _returned_parts(fl, fi, loop, graph)
                graph |= _fellow_outputs(loop, graph)
                quiet: set[int] | None = None  # (built for the first sum the loop makes)
                for stmt, acc, value in accumulations(loop, kept):
                    if id(stmt) in reported or acc in graph or acc in backed:
                        continue
                    if _arithmetic(stmt):
                        # `with torch.no_grad(): total += loss` makes a sum with no graph
                        # (an `append(loss)` there still keeps `loss` and its graph)
                        if quiet is None:
                            quiet = _under_no_grad(self.ctx, loop)
                        if id(stmt) in quiet:
                            continue
                    culprit = self._carries_graph(fi, value, graph)
                    if culprit is None or reset_inside(loop, acc, stmt):
                        continue
                    if _used_in_backward(fi, acc, events):
                        continue
                    reported.add(id(stmt))
                    self._report(fi, loop, stmt, (acc, value, culprit), events, graph)
            if fi.cls is not None and not fi.is_module:
                self._kept_on_self(fl, fi, events, kept, reported)

    def _kept_on_self(
        self,
        fl: FileLoops,
        fi: FunctionInfo,
        events: list[Event],
        kept: Callable[[ast.Call], list[ast.expr]] | None,
        reported: set[int],
    ) -> None:
        """A method that runs backward() is a training step, run once per batch: what it
        adds up into `self`'s state (`self.meter.update(loss)`, `self.total += loss`)
        outlives the call, like an accumulator defined before a loop."""
        graph = _backward_names(events)
        graph |= _parts_of(fi.node, graph) | _returned_parts(fl, fi, fi.node, graph)
        for stmt, acc, value in accumulations(fi.node, kept):
            if id(stmt) in reported or acc in graph or not acc.startswith("self."):
                continue
            culprit = self._carries_graph(fi, value, graph)
            if culprit is None or reset_inside(fi.node, acc, stmt):
                continue
            if _used_in_backward(fi, acc, events):
                continue
            reported.add(id(stmt))
            self._report(fi, fi.node, stmt, (acc, value, culprit), events, graph)

    def _carries_graph(self, fi: FunctionInfo, value: ast.expr, graph: set[str]) -> str | None:
        """The name in `value` that carries a graph, unless something detaches it."""
        if isinstance(value, ast.Name):
            if value.id in graph:
                return value.id
            held = file_flow(self.ctx).scope(_scope_node(fi)).value(value)
            if held.kind is Kind.TENSOR and held.grad:
                return value.id
            return self._bound_to_graph(fi, value.id, graph)
        if isinstance(value, ast.BinOp) and isinstance(
            value.op, ast.Add | ast.Sub | ast.Mult | ast.Div
        ):
            return self._carries_graph(fi, value.left, graph) or self._carries_graph(
                fi, value.right, graph
            )
        if isinstance(value, ast.UnaryOp):
            return self._carries_graph(fi, value.operand, graph)
        if isinstance(value, ast.Call):  # a function of the project passing the graph on
            resolved = analysis(self.ctx).resolve(fi, value, by_tail=True)
            if resolved is None or resolved[0].is_module or not value.args:
                return None
            callee, on_self = resolved
            position = graph_passing_parameter(callee.node)  # type: ignore[arg-type]
            index = position - 1 if on_self and position is not None else position
            if index is None or not 0 <= index < len(value.args):
                return None
            if any(isinstance(a, ast.Starred) for a in value.args[: index + 1]):
                return None
            return self._carries_graph(fi, value.args[index], graph)
        if isinstance(value, ast.List | ast.Tuple):  # `meter.update([l1, l2])`
            for element in value.elts:
                found = self._carries_graph(fi, element, graph)
                if found is not None:
                    return found
        return None  # calls (`.item()`, `float()`, `.detach()`), subscripts: left alone

    def _bound_to_graph(self, fi: FunctionInfo, name: str, graph: set[str]) -> str | None:
        """`name` where every binding of it in `fi` is a call passing a graph on:
        `score = diagonal_score(attn)` with `attn` carrying one."""
        values: list[ast.expr] = []
        for stmt in fi.own_statements():
            for target in bound_names(stmt):
                if target == name:
                    if not (isinstance(stmt, ast.Assign) and len(stmt.targets) == 1):
                        return None
                    values.append(stmt.value)
        if not values or not all(isinstance(v, ast.Call) for v in values):
            return None
        if name in self._following:  # `x = f(x)` does not prove itself
            return None
        self._following.add(name)
        try:
            return name if all(self._carries_graph(fi, v, graph) for v in values) else None
        finally:
            self._following.discard(name)

    def _report(
        self,
        fi: FunctionInfo,
        loop: ast.AST,
        stmt: ast.stmt,
        kept: tuple[str, ast.expr, str],
        events: list[Event],
        graph: set[str],
    ) -> None:
        acc, value, culprit = kept  # the accumulator, the value added, its graph's name
        in_method = loop is fi.node
        inside = [e for e in events if in_method or e.in_loop(loop)]
        back = next((e for e in inside if culprit in _loss_names(e)), None)
        if back is not None and back.via is not None:
            proof = f" (`{self.ctx.segment(back.node)}` at line {back.line} runs its `backward()`)"
        elif back is not None:
            proof = f" (its `backward()` is at line {back.line})"
        elif inside:
            line = inside[0].line
            proof = f" (computed with the loss whose `backward()` is at line {line})"
        else:
            proof = " (computed with gradients on)"
        where = (
            f"across calls of `{fi.name}` (a training step: it runs `backward()`)"
            if in_method
            else f"on every pass of the loop at line {loop.lineno}"  # type: ignore[attr-defined]
        )
        message = (
            f"`{self.ctx.segment(stmt)}` at line {stmt.lineno} keeps the autograd graph of "
            f"`{culprit}`{proof} alive in `{acc}` {where}: memory grows with every step"
        )
        fix: Fix | None = None
        if isinstance(stmt, ast.AugAssign) and isinstance(value, ast.Name):
            safe = plain_number_accumulator(fi, acc)
            fix = self.ctx.fix(
                f"use `{value.id}.item()`",
                self.ctx.replace(value, f"{value.id}.item()"),
                safe=safe,
            )
        self.report(
            stmt,
            message,
            fix=fix,
            hint=f"accumulate `{culprit}.item()` (a float) or `{culprit}.detach()`",
        )


def _under_no_grad(ctx: FileContext, loop: ast.AST) -> set[int]:
    """Statements of the loop inside a `with torch.no_grad():` (or `inference_mode`,
    `set_grad_enabled(False)`) block: a sum made there holds no graph."""
    text = ctx.segment(loop)
    if "grad" not in text and "inference_mode" not in text:
        return set()
    quiet: set[int] = set()
    for node in walk(loop):
        if isinstance(node, ast.With | ast.AsyncWith) and any(
            with_item_context(ctx, item.context_expr, frozenset()).no_grad for item in node.items
        ):
            for stmt in node.body:
                quiet.update(id(sub) for sub in walk(stmt))
    return quiet


def _arithmetic(stmt: ast.AST) -> bool:
    return isinstance(stmt, ast.AugAssign) or (
        isinstance(stmt, ast.Assign) and isinstance(stmt.value, ast.BinOp)
    )


def _scope_node(fi: FunctionInfo) -> ast.FunctionDef | ast.AsyncFunctionDef | ast.Module:
    return fi.node


def _loss_names(event: Event) -> set[str]:
    """`loss` for `loss.backward()`, `(loss / k).backward()`, `scaler.scale(loss)...`,
    `(l1 + l2).backward()` -- not `out` for `out.sum().backward()` (an output)."""
    assert event.expr is not None
    return _summands(event.expr) - {"self"}


def _backward_names(events: list[Event]) -> set[str]:
    names: set[str] = set()
    for e in events:
        names |= _loss_names(e)
    return names


def _parts_of(loop: ast.AST, graph: set[str]) -> set[str]:
    """Names added up into a backward()ed name in the loop: `loss = l1 + l2` -> l1, l2."""
    found: set[str] = set()
    for node in walk(loop):
        if isinstance(node, ast.Assign) and len(node.targets) == 1:
            target = dotted(node.targets[0])
            if target in graph and isinstance(node.value, ast.BinOp):
                found |= _summands(node.value)
    return found


def _returned_parts(fl: FileLoops, fi: FunctionInfo, scope: ast.AST, graph: set[str]) -> set[str]:
    """Names unpacked from a call of the file's function together with a backward()ed
    loss, that the callee added up into that loss (or returned twice):
    `loss, l1 = self.compute(x)` where `compute` returns `l1 + l2, l1`."""
    found: set[str] = set()
    for node in walk(scope):
        if not (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Tuple)
            and isinstance(node.value, ast.Call)
        ):
            continue
        names = [t.id if isinstance(t, ast.Name) else None for t in node.targets[0].elts]
        if graph.isdisjoint(names):
            continue
        resolved = fl.resolve(fi, node.value, other_files=False)
        if resolved is None or resolved[0].is_module:
            continue
        callee = resolved[0].node
        for ret in walk(callee):
            if not (
                isinstance(ret, ast.Return)
                and isinstance(ret.value, ast.Tuple)
                and len(ret.value.elts) == len(names)
            ):
                continue
            returned = [e.id if isinstance(e, ast.Name) else None for e in ret.value.elts]
            losses = {r for r, n in zip(returned, names, strict=True) if r and n in graph}
            parts = _parts_of(callee, losses) | losses  # `return loss, loss`: the same tensor
            found |= {n for r, n in zip(returned, names, strict=True) if n and r in parts}
    return found


def _fellow_outputs(loop: ast.AST, graph: set[str]) -> set[str]:
    """The names unpacked from the call whose result a backward()ed loss is computed
    from: `out, attn = model(x)` with `loss = criterion(out, y)` (the loss's input, its
    first argument), in the same pass of the same innermost loop: `attn` comes from the
    same forward pass, with its graph."""
    innermost: dict[int, ast.AST] = {}
    todo: list[tuple[ast.AST, ast.AST]] = [(loop, loop)]
    while todo:
        node, around = todo.pop()
        innermost[id(node)] = around
        inner = node if isinstance(node, ast.For | ast.AsyncFor | ast.While) else around
        todo += [(child, inner) for child in iter_children(node)]
    inputs: list[tuple[str, ast.stmt]] = []
    unpacked: list[tuple[set[str], ast.stmt]] = []
    for node in walk(loop):
        if not (isinstance(node, ast.Assign) and len(node.targets) == 1):
            continue
        value, target = node.value, node.targets[0]
        if not isinstance(value, ast.Call):
            continue
        if dotted(target) in graph and value.args and isinstance(value.args[0], ast.Name):
            inputs.append((value.args[0].id, node))
        elif isinstance(target, ast.Tuple):
            unpacked.append(({t.id for t in target.elts if isinstance(t, ast.Name)}, node))
    found: set[str] = set()
    for name, use in inputs:
        binding = max(
            (u for u in unpacked if name in u[0] and u[1].lineno < use.lineno),
            key=lambda u: u[1].lineno,
            default=None,
        )
        if binding is not None and innermost[id(binding[1])] is innermost[id(use)]:
            found |= binding[0]
    return found


def _summands(node: ast.expr) -> set[str]:
    if isinstance(node, ast.Name):
        return {node.id}
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Sub):
        return _summands(node.left) | _summands(node.right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mult | ast.Div):
        return _summands(node.left) | _summands(node.right)
    return set()


def _may_accumulate_a_loss(text: str, objects: bool) -> bool | None:
    """A cheap text test: a backward call (not just a `def backward(` line; or a call of
    one of the file's helpers that run backward() on what they are given), and, in a
    loop, or in a method (a training step run once per batch), an accumulation (`+=`,
    `a = a + v`, `.append(`; with `objects`, any method call may be one) may all be in
    this function. None: all but the backward call, which only such a helper can be."""
    body = line_end(text, 0)
    if not (
        body < len(text)
        and ("for " in text or "while " in text or "self." in text)
        and ("+" in text or "append(" in text or objects)
    ):
        return False
    return True if text.find("backward(", body) >= 0 else None


def _used_in_backward(fi: FunctionInfo, acc: str, events: list[Event]) -> bool:
    """The accumulated value goes to backward() (directly, or summed/stacked first)."""
    head = acc.split(".", 1)[0]
    pattern = re.compile(r"\b" + re.escape(acc) + r"\b")
    for e in events:
        if head in _loss_names(e):
            return True
        if e.expr is not None and pattern.search(ast.unparse(e.expr)):
            return True  # `self.total.backward()`: summed on purpose, backward()ed here
    backed = _backward_names(events)
    for stmt in fi.own_statements():
        if isinstance(stmt, ast.Assign | ast.AugAssign | ast.AnnAssign) and stmt.value is not None:
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            if any(dotted(t) in backed for t in targets) and pattern.search(
                ast.unparse(stmt.value)
            ):
                return True
        if isinstance(stmt, ast.Return) and stmt.value is not None and "backward" not in fi.text:
            return True
    return False
