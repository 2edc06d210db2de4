from __future__ import annotations

import ast
import re
from typing import ClassVar

from torchdoctor.check.analysis.file_flow import file_flow
from torchdoctor.check.analysis.scope import ScopeFlow
from torchdoctor.check.analysis.syntax import dead_loop_rebinding, lines_matching
from torchdoctor.check.analysis.values import Kind, Move, Place
from torchdoctor.check.rule import FixAvailability, Rule, Severity
from torchdoctor.check.tree_walk import walk, walk_statements

# A statement that starts with a move: `x.to(device)`, `batch[0].cuda()`; or a name
# rebound to its own move, `v = v.to(...)`: a loop variable rebound (dead_loop_rebinding).
_STATEMENT_MOVE = re.compile(
    r"[ \t]*(?:(\w+)[ \t]*=[ \t]*\1\.(?:to|cuda|cpu)\(|[\w.]+(?:\[[^\]\n]*\])*\.(?:to|cuda|cpu)\()"
)
_MOVES = (".to(", ".cuda(", ".cpu(")  # on every line _STATEMENT_MOVE matches
_MOVE_METHODS = frozenset({"to", "cuda", "cpu", "type"})  # the methods a Move calls
# Tests that expect the move to fail drop its result on purpose.
_EXPECTS_ERROR = ("assertRaises", "raises", "assertWarns", "warns")


class DiscardedTo(Rule):
    """`x.to(device)` as a statement on a tensor: `Tensor.to` is not in place.

    ## What it does
    Finds `x.to(...)`, `x.cuda()` and `x.cpu()` written as statements of their own,
    whose result is dropped, when `x` is a tensor: a batch (or part of one) from a
    `DataLoader`, a tensor made by a factory or computed from one, a parameter, or
    an argument annotated `torch.Tensor`. `model.to(device)` on a module is fine
    (`Module.to` moves the module in place) and is not reported. Also
    `for v in model.buffers(): v = v.to(device)` where `v` is not read again: the
    loop variable is rebound, the buffer itself stays where it was.

    ## Why is this bad?
    `Tensor.to()` returns a *new* tensor and leaves `x` where it was. The line
    looks like it moves the batch, but `x` stays on the CPU, and the next use
    fails with `RuntimeError: Expected all tensors to be on the same device, but
    found at least two devices, cuda:0 and cpu!` — or, for `x.to(torch.float16)`,
    the computation silently stays in float32.

    ## Example
    ```python
    for images, labels in loader:
        images.to(device)
        labels.to(device)
        loss = criterion(model(images), labels)
    ```

    ## Use instead
    ```python
    for images, labels in loader:
        images = images.to(device)
        labels = labels.to(device)
        loss = criterion(model(images), labels)
    ```

    ## Fix safety
    The fix assigns the result back (`x = x.to(device)`); it is safe because the
    statement had no other effect. No fix is offered when `x` is an element of a
    container (`batch[0]`), which may be an immutable tuple.

    ## References
    - https://pytorch.org/docs/stable/generated/torch.Tensor.to.html
    - https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.to
    """

    code = "TD102"
    name = "discarded-to"
    category = "device"
    severity = Severity.ERROR
    fix_availability = FixAvailability.SAFE
    triggers: ClassVar[tuple[str, ...]] = (".to(", ".cuda(", ".cpu(")
    node_types: ClassVar[tuple[type[ast.AST], ...]] = ()

    def finish(self) -> None:
        # only scopes with a line that starts with `x.to(`/`x.cuda(`/`x.cpu(` can drop one
        lines = lines_matching(self.ctx, _MOVES, _STATEMENT_MOVE)
        if not lines:
            return
        ff = file_flow(self.ctx)
        for node in dict.fromkeys(ff.innermost_scope(line) for line in lines):
            if not may_drop_a_move(node):
                continue  # (most: the lines are a call's arguments, `f(\n x.to(d))`)
            scope = ff.scope(node, callers=False)
            for move in scope.moves:
                if self._is_tensor(move) and (
                    move.dropped or dead_loop_rebinding(scope.node, move.call)
                ):
                    self._report(scope, move)

    @staticmethod
    def _is_tensor(move: Move) -> bool:
        if not isinstance(move.receiver, ast.Name | ast.Attribute | ast.Subscript):
            return False
        before = move.before
        if before.kind in (Kind.TENSOR, Kind.PARAMETER):
            return True
        # parts of a batch are tensors; a whole batch of a DataLoader with the default
        # collate is a tensor if it has `.to()`, while a custom collate_fn may return an
        # object that moves in place
        if before.kind is not Kind.BATCH or (before.moves_in_place and not before.part):
            return False  # a BatchEncoding's `.to()` moves it in place
        return before.part or (before.place is Place.CPU and not before.assumed)

    def _report(self, scope: ScopeFlow, move: Move) -> None:
        if self._expects_error(scope, move.call):
            return
        receiver = self.ctx.segment(move.receiver)
        call = " ".join(self.ctx.segment(move.call).split())
        if move.dtype_only:
            effect = "keeps its dtype"
        else:
            effect = "stays where it was"
            if move.before.kind is Kind.BATCH:
                effect = f"stays on the CPU (a batch from {move.before.describe_origin()})"
        if not move.dropped:
            message = (
                f"`{call}` does not change the item `{receiver}` was taken from: "
                f"`Tensor.{_method(move)}` returns a new tensor, and rebinding the loop "
                f"variable `{receiver}` to it (never read again) drops it, so the item {effect}"
            )
            self.report(move.call, message)
            return
        message = (
            f"`{call}` does not change `{receiver}`: `Tensor.{_method(move)}` returns a new "
            f"tensor and this statement drops it, so `{receiver}` {effect}"
        )
        fix = None
        if isinstance(move.receiver, ast.Name | ast.Attribute):
            fix = self.ctx.fix(
                f"assign the result: `{receiver} = {call}`",
                self.ctx.replace(move.call, f"{receiver} = {self.ctx.segment(move.call)}"),
            )
        self.report(move.call, message, fix=fix)

    def _expects_error(self, scope: ScopeFlow, call: ast.Call) -> bool:
        """Inside `with self.assertRaises(...)` / `pytest.raises(...)`."""
        for node in walk(scope.node):
            if isinstance(node, ast.With | ast.AsyncWith):
                names = [self.ctx.segment(item.context_expr) for item in node.items]
                if any(w in n for n in names for w in _EXPECTS_ERROR):
                    start, end = node.lineno, node.end_lineno or node.lineno
                    if start <= call.lineno <= end:
                        return True
        return False


def may_drop_a_move(node: ast.AST) -> bool:
    """Whether the code of `node` holds a statement that drops a call of a move method
    (`x.to(d)`) or a loop variable rebound to one (`v = v.to(d)`, `dead_loop_rebinding`):
    a scope without one has no move this rule reports (`Move.call` is such a call, and
    `Move.dropped` says it is an expression statement's value), and is not analysed."""
    for stmt in walk_statements(node):
        if stmt.__class__ is ast.Expr:
            if _move_call(stmt.value):  # type: ignore[attr-defined]
                return True
        elif isinstance(stmt, ast.For | ast.AsyncFor) and isinstance(stmt.target, ast.Name):
            name = stmt.target.id
            for inner in stmt.body:
                if (
                    isinstance(inner, ast.Assign)
                    and _move_call(inner.value)
                    and isinstance(inner.value.func.value, ast.Name)  # type: ignore[attr-defined]
                    and inner.value.func.value.id == name  # type: ignore[attr-defined]
                ):
                    return True
    return False


def _move_call(node: ast.expr) -> bool:
    """A call of a method that moves its receiver (`ScopeMoves._move`, `_retype`)."""
    return (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _MOVE_METHODS
    )


def _method(move: Move) -> str:
    func = move.call.func
    return f"{func.attr}()" if isinstance(func, ast.Attribute) else "to()"
