from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, ClassVar

from torchdoctor.check.rule import FixAvailability, Rule, Severity
from torchdoctor.check.tree_walk import walk, walk_statements

if TYPE_CHECKING:
    from torchdoctor.check.context import FileContext

# Reductions that give a 0-dim tensor when called with no arguments.
_REDUCTIONS = frozenset({"sum", "mean", "prod", "norm", "max", "min", "std", "var", "dot"})
# Text without any of these cannot prove a value 0-dim.
_EVIDENCE_WORDS = ("backward(", "loss", "Loss", "criterion", "cross_entropy", ".sum(", ".mean(")
# torch functions that keep the shape of their one argument.
_ELEMENTWISE = frozenset(
    {"abs", "exp", "log", "sqrt", "neg", "sigmoid", "tanh", "relu", "square", "clamp"}
)
# torch.nn.functional losses (their default reduction gives a 0-dim tensor).
_FUNCTIONAL_LOSS = re.compile(r"loss|cross_entropy|kl_div|^nll|hinge|margin")

# A character that would make the text after it part of a longer name or an attribute.
_NAME_BEFORE = re.compile(r"[\w.]")


@dataclass
class _ScopeFacts:
    backward: set[str] = field(default_factory=set)
    assigned: dict[str, list[ast.Assign]] = field(default_factory=dict)
    added: dict[str, list[ast.expr]] = field(default_factory=dict)  # `name += value`


class ScalarByIndex(Rule):
    """`loss.data[0]` / `loss[0]` on a 0-dim tensor: use `.item()`.

    ## What it does
    Finds `[0]` indexing of values that are provably 0-dim tensors: losses
    (`loss.data[0]`, `criterion(out, y).data[0]`), no-argument reductions
    (`(pred == y).sum().data[0]`), and names the same function calls
    `.backward()` on with no arguments (which only works for a scalar), or
    assigns from a loss function (`F.cross_entropy(...)`, a
    `criterion = nn.CrossEntropyLoss()` call) with its default reduction.
    A name that only looks like a loss is left alone when the function makes it
    by a reduction that keeps its dimensions (`loss = loss.mean(dim=0,
    keepdim=True)`, also added into `total_loss`): a 1-element vector.

    ## Why is this bad?
    Before PyTorch 0.4 a loss was a 1-element vector and `loss.data[0]` read its
    value. Since 0.4 losses and full reductions are 0-dim tensors, and indexing
    one fails: `IndexError: invalid index of a 0-dim tensor. Use
    `tensor.item()` in Python or `tensor.item<T>()` in C++ to convert a 0-dim
    tensor to a number`. Code copied from older tutorials crashes at the first
    logging step.

    ## Example
    ```python
    loss = criterion(model(x), y)
    loss.backward()
    running_loss += loss.data[0]
    correct += (pred == y).sum().data[0]
    ```

    ## Use instead
    ```python
    running_loss += loss.item()
    correct += (pred == y).sum().item()
    ```

    ## Fix safety
    The fix replaces `x.data[0]` / `x[0]` by `x.item()`. It is safe where the
    value is proven 0-dim (a `.backward()` call, a reduction or a loss function
    with its default reduction); where only the name (`loss`, `total_loss`)
    suggests a scalar it is offered as an unsafe fix, since a 1-element vector
    would then give a Python number instead of a 0-dim tensor.

    ## References
    - https://pytorch.org/docs/stable/generated/torch.Tensor.item.html
    - https://github.com/pytorch/pytorch/releases/tag/v0.4.0
    """

    code = "TD303"
    name = "scalar-by-index"
    category = "loss"
    severity = Severity.ERROR
    fix_availability = FixAvailability.SAFE
    triggers: ClassVar[tuple[str, ...]] = ("[0]",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = (ast.Subscript,)

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._scopes: dict[int, _ScopeFacts] = {}
        self._relevant: dict[int, bool] = {}
        self._assigned_names: dict[str, bool] = {}

    def visit_needles(self) -> tuple[str, ...]:
        return ("[0]",)

    def visit(self, node: ast.AST) -> None:
        assert isinstance(node, ast.Subscript)
        index = node.slice
        if not (isinstance(index, ast.Constant) and index.value == 0 and type(index.value) is int):
            return
        if not isinstance(node.ctx, ast.Load):
            return
        value = node.value
        via_data = isinstance(value, ast.Attribute) and value.attr == "data"
        tensor = value.value if isinstance(value, ast.Attribute) and via_data else value
        proof = self._scalar_proof(tensor, node, method_reductions=via_data)
        if proof is None and via_data and _loss_name(tensor) and not self._keeps_dims(tensor):
            proof = ""  # only the name says so
        if proof is None and via_data:
            proof = self._scalar_arithmetic(tensor, node, depth=3)
        if proof is None:
            return
        text = self.ctx.segment(tensor)
        if not isinstance(tensor, ast.Name | ast.Attribute | ast.Call | ast.Subscript):
            text = f"({text})"  # `(a + b).data[0]`: the segment leaves out the parentheses
        shown = self.ctx.segment(node)
        fix = self.ctx.fix(
            f"replace `{shown}` with `{text}.item()`",
            self.ctx.replace(node, f"{text}.item()"),
            safe=bool(proof),
        )
        because = f" ({proof})" if proof else ""
        self.report(
            node,
            f"`{shown}` indexes a 0-dim tensor{because}: IndexError since PyTorch "
            f"0.4; use `{text}.item()`",
            fix=fix,
        )

    # -- evidence that a value is a 0-dim tensor -----------------------------------
    def _scalar_proof(
        self, tensor: ast.expr, at: ast.AST, *, method_reductions: bool
    ) -> str | None:
        """Why `tensor` is 0-dim (a short phrase), or None if it is not known to be.

        `x.sum()` only counts after `.data` (which only tensors have): a pandas
        `df.sum()` is a Series that `[0]` indexes fine."""
        if isinstance(tensor, ast.Call):
            return self._scalar_call(tensor, method_reductions)
        if not isinstance(tensor, ast.Name):
            return None
        scope = self.ctx.enclosing_function() or self.ctx.tree
        if not self._may_prove(scope):
            return None
        facts = self._facts(scope)
        if tensor.id in facts.backward:
            return f"`{tensor.id}.backward()` needs a scalar"
        line = getattr(at, "lineno", 0)
        earlier = [a for a in facts.assigned.get(tensor.id, ()) if a.lineno < line]
        if earlier:
            value = max(earlier, key=lambda a: a.lineno).value
            if isinstance(value, ast.Call):
                return self._scalar_call(value, method_reductions)
        return None

    def _scalar_arithmetic(self, expr: ast.expr, at: ast.AST, depth: int) -> str | None:
        """`(d_loss_real + torch.abs(diff)).data[0]`: arithmetic and elementwise torch
        functions of scalars are scalars. Only used after `.data` (tensors only)."""
        if depth == 0:
            return None
        if isinstance(expr, ast.BinOp):
            left = self._scalar_operand(expr.left, at, depth)
            right = self._scalar_operand(expr.right, at, depth)
            if left is None or right is None:
                return None
            if not (left and right):
                return ""  # an operand is a scalar by its name only
            return "arithmetic of scalars"
        if isinstance(expr, ast.UnaryOp):
            return self._scalar_operand(expr.operand, at, depth)
        if isinstance(expr, ast.Call) and len(expr.args) == 1 and not expr.keywords:
            name = self.ctx.qualname(expr.func) or ""
            if name.startswith("torch.") and name[6:] in _ELEMENTWISE:
                return self._scalar_operand(expr.args[0], at, depth)
        return None

    def _scalar_operand(self, expr: ast.expr, at: ast.AST, depth: int) -> str | None:
        if isinstance(expr, ast.Constant) and isinstance(expr.value, int | float):
            return "a number"
        proof = self._scalar_proof(expr, at, method_reductions=True)
        if proof is None and _loss_name(expr):
            proof = ""
        if proof is None:
            proof = self._scalar_arithmetic(expr, at, depth - 1)
        return proof

    def _keeps_dims(self, tensor: ast.expr) -> bool:
        """Counter-evidence to a loss-like name: the scope makes it (or adds into it) a
        reduction that keeps its dimensions (`loss = loss.mean(dim=0, keepdim=True)`,
        `total_loss += loss`): a 1-element vector, which `[0]` indexes fine."""
        if not isinstance(tensor, ast.Name) or "keepdim" not in self.ctx.source:
            return False
        facts = self._facts(self.ctx.enclosing_function() or self.ctx.tree)

        def made(name: str) -> list[ast.expr]:
            return [a.value for a in facts.assigned.get(name, ())] + facts.added.get(name, [])

        values = made(tensor.id)
        values += [v for n in values if isinstance(n, ast.Name) for v in made(n.id)]
        return any(
            isinstance(value, ast.Call)
            and any(
                kw.arg == "keepdim" and isinstance(kw.value, ast.Constant) and kw.value.value
                for kw in value.keywords
            )
            for value in values
        )

    def _may_prove(self, scope: ast.AST) -> bool:
        """Cheap text test before the walk: no `.backward(`, loss or reduction, no proof."""
        key = id(scope)
        known = self._relevant.get(key)
        if known is None:
            text = self.ctx.source if isinstance(scope, ast.Module) else self.ctx.segment(scope)
            known = any(word in text for word in _EVIDENCE_WORDS)
            self._relevant[key] = known
        return known

    def _facts(self, scope: ast.AST) -> _ScopeFacts:
        """Names a function calls `.backward()` on, and its simple assignments (once)."""
        facts = self._scopes.get(id(scope))
        if facts is None:
            facts = _ScopeFacts()
            for sub in walk_statements(scope):
                if isinstance(sub, ast.Assign):
                    for target in sub.targets:
                        if isinstance(target, ast.Name):
                            facts.assigned.setdefault(target.id, []).append(sub)
                elif isinstance(sub, ast.AugAssign) and isinstance(sub.target, ast.Name):
                    facts.added.setdefault(sub.target.id, []).append(sub.value)
            if "backward" in self.ctx.source:  # else no `.backward()` call to find
                for sub in walk(scope):
                    if (
                        isinstance(sub, ast.Call)
                        and isinstance(sub.func, ast.Attribute)
                        and sub.func.attr == "backward"
                        and isinstance(sub.func.value, ast.Name)
                        and not sub.args
                        and not any(kw.arg in ("gradient", None) for kw in sub.keywords)
                    ):
                        facts.backward.add(sub.func.value.id)
            self._scopes[id(scope)] = facts
        return facts

    def _scalar_call(self, call: ast.Call, method_reductions: bool) -> str | None:
        func = call.func
        if any(
            kw.arg == "reduction"
            and isinstance(kw.value, ast.Constant)
            and kw.value.value == "none"
            for kw in call.keywords
        ):
            return None
        # x.sum(), (pred == y).sum(), torch.mean(x) with no dim
        if isinstance(func, ast.Attribute) and func.attr in _REDUCTIONS:
            receiver_is_torch = self.ctx.qualname(func.value) == "torch"
            if not (receiver_is_torch or method_reductions):
                return None
            args_left = len(call.args) - (1 if receiver_is_torch else 0)
            if args_left == 0 and not call.keywords:
                return f"`.{func.attr}()` of a whole tensor"
            return None
        name = self.ctx.qualname(func) or ""
        if name.startswith("torch.nn.functional.") and _FUNCTIONAL_LOSS.search(name[20:]):
            return f"`{name.rsplit('.', 1)[-1]}` returns a scalar"
        if isinstance(func, ast.Name) and self._is_loss_module(func.id):
            return f"`{func.id}(...)` is a loss module's scalar"
        return None

    def _is_loss_module(self, name: str) -> bool:
        """`criterion = nn.CrossEntropyLoss()` (default reduction) somewhere in the file."""
        if "Loss" not in self.ctx.source or not self._may_be_assigned(name):
            return False  # cheap tests first: no `...Loss` class named, or `name = ` nowhere
        for sub in self._facts(self.ctx.tree).assigned.get(name, ()):
            if isinstance(sub.value, ast.Call):
                built = self.ctx.qualname(sub.value.func) or ""
                if built.startswith("torch.nn.") and built.endswith("Loss"):
                    return not any(kw.arg == "reduction" for kw in sub.value.keywords)
        return False

    def _may_be_assigned(self, name: str) -> bool:
        """Whether the text has `name` followed by `=` (after spaces, `)`, line
        continuations or comments), as any `name = ...` assignment has."""
        known = self._assigned_names.get(name)
        if known is None:
            # the name first: a pattern starting with a literal is searched for fast
            pattern = rf"{re.escape(name)}(?:[ \t\r\n\f)\\]|#[^\r\n]*)*=(?!=)"
            source = self.ctx.source
            known = any(
                match.start() == 0 or not _NAME_BEFORE.match(source, match.start() - 1)
                for match in re.finditer(pattern, source)
            )
            self._assigned_names[name] = known
        return known


def _loss_name(node: ast.expr) -> bool:
    """`loss`, `total_loss`, `self.loss_G`, `d_loss`; not `losses`."""
    name = node.id if isinstance(node, ast.Name) else getattr(node, "attr", "")
    lowered = name.lower()
    return "loss" in lowered and "losses" not in lowered
