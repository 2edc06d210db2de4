from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from typing import ClassVar

from torchdoctor.check.analysis.class_calls import project_mro
from torchdoctor.check.analysis.file_flow import file_flow
from torchdoctor.check.analysis.file_loops import analysis
from torchdoctor.check.analysis.grad_contexts import is_no_grad_decorated, with_item_context
from torchdoctor.check.analysis.syntax import dotted, findall_at
from torchdoctor.check.context import FileContext
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules._inplace_text import may_write_saved
from torchdoctor.check.tree_walk import walk, walk_statements

# Ops whose backward reads their own output: autograd saves the result.
_RESULT_SAVING = frozenset(
    {"relu", "sigmoid", "tanh", "exp", "softmax", "log_softmax", "sqrt", "rsqrt", "reciprocal"}
)
_RESULT_SAVING_MODULES = frozenset({"ReLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax"})
_FUNCTION_PREFIXES = ("torch.", "torch.nn.functional.", "torch.special.")
# Tensor methods that write into the tensor they are called on.
_INPLACE_METHODS = frozenset(
    {
        "add_", "sub_", "mul_", "div_", "zero_", "fill_", "copy_", "clamp_", "clamp_min_",
        "clamp_max_", "masked_fill_", "masked_scatter_", "index_add_", "index_fill_",
        "index_copy_", "index_put_", "scatter_", "scatter_add_", "pow_", "sqrt_", "exp_",
        "abs_", "neg_", "relu_", "sigmoid_", "tanh_", "clip_", "addcmul_", "addcdiv_",
        "lerp_", "fmod_", "sign_", "log_", "floor_", "ceil_", "round_", "normal_",
        "uniform_", "t_", "transpose_", "squeeze_", "unsqueeze_", "resize_",
    }
)  # fmt: skip
# Layers without parameters: their output needs grad only when their input does.
_PARAMETER_FREE = re.compile(
    r"Dropout|Pool|Identity|Flatten|Upsample|Pad|ReLU|GELU|SiLU|ELU|Sigmoid|Tanh|Softmax|Shuffle"
)
_MULTI_VIEWS = frozenset({"chunk", "split", "unbind", "split_with_sizes", "tensor_split"})
_VIEWS_WHY = "returns several views of one tensor, which autograd forbids changing in place"
_BINOP_SAVES = (ast.Mult, ast.Div, ast.MatMult)
_MATMULS = frozenset({"matmul", "mm", "bmm", "mul", "div", "einsum"})


@dataclass
class _State:
    tainted: set[str] = field(default_factory=set)  # names holding values that need grad
    saved: dict[str, tuple[int, str]] = field(default_factory=dict)  # name -> (line, why)
    layers: set[str] = field(default_factory=set)  # `for layer in self.blocks:` names

    def copy(self) -> _State:
        return _State(set(self.tainted), dict(self.saved), set(self.layers))

    def merge(self, other: _State) -> None:
        self.tainted |= other.tainted
        self.layers &= other.layers
        for name, why in other.saved.items():
            self.saved.setdefault(name, why)


_SELF_CALL = re.compile(r"\bself\.(\w+)\(")
_SELF_ASSIGNED = re.compile(r"\bself\.(\w+)\s*(?::[^=\n]*)?=[^=]")


class InplaceOnSavedTensor(Rule):
    """An in-place op on a tensor that autograd saved for the backward pass.

    ## What it does
    In the methods of an `nn.Module` (outside `no_grad`/`inference_mode` blocks and
    decorators), follows the tensors that need gradients -- results of the module's own
    layers (`self.conv(x)`), its `nn.Parameter`s, and what is computed from them -- and
    finds an in-place write (`x += skip`, `x /= norm`, `x[mask] = 0`, `x.mul_(...)`,
    `x.relu_()`, `F.relu(x, inplace=True)`, an `nn.ReLU(inplace=True)` layer) to a tensor
    that autograd saved:

    - the output of an op whose backward reads its own result: ReLU, sigmoid, tanh, exp,
      softmax, log-softmax, sqrt, rsqrt, reciprocal (as `torch.*`, `F.*`, tensor methods
      or `nn.ReLU`/`nn.Sigmoid`/... layers);
    - an operand of `*`, `/`, `@`, `matmul`, ... whose other operand needs gradients.

    Methods the class inherits, also from a base class in another file of the project,
    are followed too (`self.value(x)` of a base that calls the subclass's layers).
    A name bound again (`x = x + skip`) is a new tensor and is no longer followed.
    Tensors whose need for gradients the code does not show (a `forward` argument) are
    not followed: the rule stays quiet where it cannot tell.

    ## Why is this bad?
    The backward pass reads the saved tensor, and autograd checks that it is unchanged
    (its version counter). `loss.backward()` then raises `RuntimeError: one of the
    variables needed for gradient computation has been modified by an inplace
    operation` -- far from the line at fault, which the error does not name. On by
    default: it always fails once the loss is backpropagated.

    ## Example
    ```python
    def forward(self, x):
        out = torch.relu(self.conv(x))
        out += self.skip(x)        # ReLU's backward needs `out` unchanged
        return out
    ```

    ## Use instead
    ```python
    def forward(self, x):
        out = torch.relu(self.conv(x))
        out = out + self.skip(x)
        return out
    ```

    ## Fix safety
    No fix is offered: the out-of-place form allocates a new tensor, which may matter
    for memory in a large model.

    ## References
    - https://pytorch.org/docs/stable/notes/autograd.html#in-place-operations-with-autograd
    - https://pytorch.org/docs/stable/autograd.html#in-place-correctness-checks
    """

    code = "TD215"
    name = "inplace-on-saved-tensor"
    category = "training"
    severity = Severity.ERROR
    triggers: ClassVar[tuple[str, ...]] = ("self.",)

    def finish(self) -> None:
        fl = None
        for cls in file_flow(self.ctx).every_class():
            if not self.ctx.is_module_class(cls):
                continue
            if not self._may_write_in_place(cls):
                continue  # cheap first: no in-place write in the text it reports in
            # The class and its bases, also those of other files of the project: an
            # inherited `self.V(x)` runs the base's method, which may call this class's.
            layers: dict[str, str] = {}
            methods: list[tuple[FileContext, ast.FunctionDef, bool]] = []
            seen: set[str] = set()
            chain: list[tuple[FileContext, ast.ClassDef]] = [(self.ctx, cls)]
            if self._readable_base(cls):  # the file's loop analysis only where it is used
                fl = fl or analysis(self.ctx)
                chain = [(owner.ctx, node) for owner, node in project_mro(fl, cls)]
            for ctx, node in chain:
                for attr, kind in self._layers(ctx, node).items():
                    layers.setdefault(attr, kind)
                for m in node.body:
                    if isinstance(m, ast.FunctionDef) and m.name not in seen:
                        seen.add(m.name)
                        if m.name != "__init__" and not is_no_grad_decorated(ctx, m):
                            methods.append((ctx, m, node is cls))
            # a method that neither returns a value nor (the class's own) may write in
            # place changes nothing its walk could tell: left out of every pass
            methods = [m for m in methods if _may_matter(*m, layers)]
            # Summaries first: which methods return a value that needs grad
            # (`self.encode(x)` is then followed like a layer's output).
            # The findings of the class's own methods are those of the pass that changes
            # nothing (it sees the final summaries): kept from it, not walked again.
            returns_grad: set[str] = set()
            found: list[tuple[ast.AST, str, str]] = []
            for _ in range(4):
                before = len(returns_grad)
                found = []
                for ctx, method, own in methods:
                    walker = _Method(self, ctx, layers, returns_grad, found if own else None)
                    walker.block(method.body, _State(), False)
                    if walker.returns_grad:
                        returns_grad.add(method.name)
                if len(returns_grad) == before:
                    break
            else:
                found = []
                for ctx, method, own in methods:
                    if own:
                        _Method(self, ctx, layers, returns_grad, found).block(
                            method.body, _State(), False
                        )
            for where, message, hint in found:
                self.report(where, message, hint=hint)

    def _may_write_in_place(self, cls: ast.ClassDef) -> bool:
        """Whether a method this rule reports in (not `__init__`) may write in place: its
        text has an in-place operator or method, or the class builds an in-place layer."""
        if "inplace" in self.ctx.segment(cls):
            return True  # `nn.ReLU(inplace=True)` in __init__, run by `self.act(x)`
        return any(
            isinstance(m, ast.FunctionDef)
            and m.name != "__init__"
            and may_write_saved(self.ctx.segment(m))
            for m in cls.body
        )

    def _readable_base(self, cls: ast.ClassDef) -> bool:
        """The class calls `self.m(...)` it neither defines nor assigns, and has a base
        that is not torch's: defined in the file or imported (maybe from a module of
        the project)."""
        text = self.ctx.segment(cls)
        called = set(findall_at(text, "self.", _SELF_CALL))
        called -= {m.name for m in cls.body if isinstance(m, ast.FunctionDef)}
        called -= set(findall_at(text, "self.", _SELF_ASSIGNED))
        if not called:
            return False  # cheap first: nothing a base defines is used
        for base in cls.bases:
            name = self.ctx.qualname(base) or dotted(base) or ""
            if name and not name.startswith(("torch.", "typing.", "abc.")):
                return True
        return False

    def _layers(self, ctx: FileContext, cls: ast.ClassDef) -> dict[str, str]:
        """`self.act` -> what the class's assignments make it: "saves" (its output is
        saved), "inplace", "both", "param", "pass" (no parameters), "weights"."""
        layers: dict[str, str] = {}
        for node in walk_statements(cls):
            if not (isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)):
                continue
            name = ctx.qualname(node.value.func) or ""
            last = name.rsplit(".", 1)[-1]
            inplace = any(
                k.arg == "inplace" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in node.value.keywords
            )
            kind = ""
            if last == "Parameter":
                kind = "param"
            elif last in _RESULT_SAVING_MODULES:
                kind = "both" if inplace else "saves"
            elif inplace:
                kind = "inplace"
            elif _PARAMETER_FREE.search(last):
                kind = "pass"  # output needs grad when its input does
            elif (name.startswith("torch.nn.") and last[:1].isupper()) or (
                self.ctx.project.is_module_class_name(name) and last[:1].isupper()
            ):
                kind = "weights"  # a layer with parameters: its output needs grad
            for target in node.targets:
                if kind and isinstance(target, ast.Attribute) and _is_self(target.value):
                    layers[target.attr] = kind
        return layers


def _may_matter(
    ctx: FileContext, method: ast.FunctionDef, own: bool, layers: dict[str, str]
) -> bool:
    """Whether `_Method` walking `method` may add to what the class's walk finds: a
    returned value (it may need grad: `returns_grad`), or, in a method of the class
    itself, a node `_Method.inplace_writes` checks (the only place a finding is made)."""
    for node in walk(method):
        if isinstance(node, ast.Return) and node.value is not None:
            return True
        if not own:
            continue
        if isinstance(node, ast.AugAssign):
            return True
        if isinstance(node, ast.Assign) and any(isinstance(t, ast.Subscript) for t in node.targets):
            return True
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Attribute) and func.attr in _INPLACE_METHODS:
            return True
        if not (node.args and isinstance(node.args[0], ast.Name)):
            continue
        if any(k.arg == "inplace" for k in node.keywords):
            return True
        if (
            isinstance(func, ast.Attribute)
            and _is_self(func.value)
            and layers.get(func.attr) in ("inplace", "both")
        ):
            return True
        if (ctx.qualname(func) or "").endswith("_"):
            return True
    return False


def _is_self(node: ast.expr) -> bool:
    return isinstance(node, ast.Name) and node.id == "self"


class _Method:
    def __init__(
        self,
        rule: InplaceOnSavedTensor,
        ctx: FileContext,
        layers: dict[str, str],
        grad_methods: set[str],
        found: list[tuple[ast.AST, str, str]] | None,
    ) -> None:
        self.rule = rule
        self.ctx = ctx  # the file the method is in (a base class may be in another)
        self.layers = layers
        self.grad_methods = grad_methods  # methods of the class that return grad values
        self.found = found  # (node, message, hint) of each finding; None: none kept
        self.returns_grad = False
        self.reported: set[int] = set()

    # -- statements ---------------------------------------------------------
    def block(self, stmts: list[ast.stmt], state: _State, no_grad: bool) -> None:
        for stmt in stmts:
            self.statement(stmt, state, no_grad)

    def statement(self, stmt: ast.stmt, state: _State, no_grad: bool) -> None:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return
        if isinstance(stmt, ast.With | ast.AsyncWith):
            inner = no_grad or any(
                with_item_context(self.ctx, item.context_expr, frozenset()).no_grad
                for item in stmt.items
            )
            self.block(stmt.body, state, inner)
            return
        if isinstance(stmt, ast.If):
            other = state.copy()
            self.block(stmt.body, state, no_grad)
            self.block(stmt.orelse, other, no_grad)
            state.merge(other)
            return
        if isinstance(stmt, ast.For | ast.While):
            if isinstance(stmt, ast.For) and isinstance(stmt.target, ast.Name):
                state.tainted.discard(stmt.target.id)
                state.saved.pop(stmt.target.id, None)
                state.layers.discard(stmt.target.id)
                if self.layer_container(stmt.iter):
                    state.layers.add(stmt.target.id)  # each item is one of its layers
            for _ in range(2):  # the next pass sees what the last one left
                self.block(stmt.body, state, no_grad)
            self.block(stmt.orelse, state, no_grad)
            return
        if isinstance(stmt, ast.Try):
            for part in (stmt.body, *(h.body for h in stmt.handlers), stmt.orelse, stmt.finalbody):
                self.block(part, state, no_grad)
            return
        if not no_grad:
            self.inplace_writes(stmt, state)
        if isinstance(stmt, ast.Return) and stmt.value is not None and not no_grad:
            self.returns_grad = self.returns_grad or self.needs_grad(stmt.value, state)
        if isinstance(stmt, ast.Assign | ast.AnnAssign) and stmt.value is not None:
            targets: list[ast.expr] = (
                stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            )
            self.assign(targets, stmt.value, stmt.lineno, state, no_grad)

    def assign(
        self, targets: list[ast.expr], value: ast.expr, line: int, state: _State, no_grad: bool
    ) -> None:
        needs_grad = not no_grad and self.needs_grad(value, state)
        if not no_grad:
            self.saved_operands(value, line, state)
        names = [n.id for t in targets for n in walk(t) if isinstance(n, ast.Name)]
        for name in names:
            state.saved.pop(name, None)
            state.tainted.discard(name)
            state.layers.discard(name)
            if needs_grad:
                state.tainted.add(name)
        why = self.result_saved(value) if needs_grad else None
        if why and len(targets) == 1 and isinstance(targets[0], ast.Name):
            state.saved[targets[0].id] = (line, why)
        views = self.multi_output_views(value) if needs_grad else None
        if views and len(targets) == 1 and isinstance(targets[0], ast.Tuple | ast.List):
            for elt in targets[0].elts:
                if isinstance(elt, ast.Name):
                    state.saved[elt.id] = (line, views)

    # -- what needs grad, what is saved ---------------------------------------
    def layer_container(self, expr: ast.expr) -> bool:
        """`self.blocks` (or a slice of it) where the class makes it a layer with
        parameters (`nn.Sequential(...)`, `nn.ModuleList(...)`)."""
        if isinstance(expr, ast.Subscript) and isinstance(expr.slice, ast.Slice):
            expr = expr.value
        return (
            isinstance(expr, ast.Attribute)
            and _is_self(expr.value)
            and self.layers.get(expr.attr) == "weights"
        )

    def needs_grad(self, expr: ast.expr, state: _State) -> bool:
        for node in walk(expr):
            if isinstance(node, ast.Name) and node.id in state.tainted:
                return True
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Name)
                and node.func.id in state.layers
            ):
                return True  # `x = layer(x)` over the layers of a container with weights
            if (
                isinstance(node, ast.Attribute)
                and _is_self(node.value)
                and self.layers.get(node.attr) == "param"
            ):
                return True
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and _is_self(node.func.value)
                and node.func.attr in self.layers
                and any(self.needs_grad(a, state) for a in node.args)
            ):
                return True
            if (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and _is_self(node.func.value)
                and (
                    self.layers.get(node.func.attr) == "weights"
                    or node.func.attr in self.grad_methods
                )
            ):
                return True
        return False

    def result_saved(self, value: ast.expr) -> str | None:
        if not isinstance(value, ast.Call):
            return None
        func = value.func
        name = self.ctx.qualname(func) or ""
        last = name.rsplit(".", 1)[-1]
        text = self.ctx.segment(func)
        if last in _RESULT_SAVING and name.startswith(_FUNCTION_PREFIXES):
            return f"`{text}(...)` saves its output for backward"
        if isinstance(func, ast.Attribute) and _is_self(func.value):
            if self.layers.get(func.attr) in ("saves", "both"):
                return f"`{text}` saves its output for backward"
            return None
        if isinstance(func, ast.Attribute) and func.attr in _RESULT_SAVING:
            return f"`.{func.attr}()` saves its output for backward"
        return None

    def multi_output_views(self, value: ast.expr) -> str | None:
        """`x.chunk(3)`, `torch.split(x, n)`, `x.unbind()`: views autograd forbids changing
        in place (`Output 0 of SplitBackward0 is a view and is being modified inplace`)."""
        if not isinstance(value, ast.Call):
            return None
        func = value.func
        name = self.ctx.qualname(func) or ""
        if isinstance(func, ast.Attribute) and not name.startswith("torch."):
            name = "." + func.attr  # a tensor method
        if not name.startswith(("torch.", ".")) or name.rsplit(".", 1)[-1] not in _MULTI_VIEWS:
            return None
        return f"`{self.ctx.segment(func)}(...)` {_VIEWS_WHY}"

    def saved_operands(self, value: ast.expr, line: int, state: _State) -> None:
        """Names saved as an operand of `a * b`, `a / b`, `a @ b`, `torch.matmul(a, b)`."""
        for node in walk(value):
            pairs: list[tuple[ast.expr, ast.expr, str]] = []
            if isinstance(node, ast.BinOp) and isinstance(node.op, _BINOP_SAVES):
                pairs = [(node.left, node.right, self.ctx.segment(node))]
                pairs.append((node.right, node.left, self.ctx.segment(node)))
            elif isinstance(node, ast.Call) and len(node.args) == 2:
                name = self.ctx.qualname(node.func) or ""
                if name.startswith("torch.") and name.rsplit(".", 1)[-1] in _MATMULS:
                    a, b = node.args
                    pairs = [(a, b, self.ctx.segment(node)), (b, a, self.ctx.segment(node))]
            for operand, other, text in pairs:
                if isinstance(operand, ast.Name) and self.needs_grad(other, state):
                    state.saved.setdefault(operand.id, (line, f"`{text}` saves it for backward"))

    # -- in-place writes ------------------------------------------------------
    def inplace_writes(self, stmt: ast.stmt, state: _State) -> None:
        if isinstance(stmt, ast.AugAssign):
            target: ast.expr = stmt.target
            base = target.value if isinstance(target, ast.Subscript) else target
            if isinstance(base, ast.Name):
                self.check(stmt, base.id, state)
        if isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Subscript) and isinstance(target.value, ast.Name):
                    self.check(stmt, target.value.id, state)
        for node in walk(stmt):
            if not isinstance(node, ast.Call):
                continue
            func = node.func
            if isinstance(func, ast.Attribute) and func.attr in _INPLACE_METHODS:
                if isinstance(func.value, ast.Name):
                    self.check(node, func.value.id, state)
                continue
            name = self.ctx.qualname(func) or ""
            first = node.args[0] if node.args else None
            if not isinstance(first, ast.Name):
                continue
            inplace_kw = any(
                k.arg == "inplace" and isinstance(k.value, ast.Constant) and k.value.value is True
                for k in node.keywords
            )
            if (name.startswith(_FUNCTION_PREFIXES) and (name.endswith("_") or inplace_kw)) or (
                isinstance(func, ast.Attribute)
                and _is_self(func.value)
                and self.layers.get(func.attr) in ("inplace", "both")
            ):
                self.check(node, first.id, state)

    def check(self, node: ast.AST, name: str, state: _State) -> None:
        saved = state.saved.get(name)
        line = getattr(node, "lineno", 0)
        if saved is None or line in self.reported:
            return
        self.reported.add(line)
        if self.found is None:
            return
        text = self.ctx.segment(node)
        if len(text) > 50:
            text = text[:47] + "..."
        if saved[1].endswith(_VIEWS_WHY):
            consequence = (
                f"`{name}` is one of them (line {saved[0]}: {saved[1]}): RuntimeError: "
                "Output 0 of Split is a view and is being modified inplace"
            )
        else:
            consequence = (
                f"autograd saved `{name}` for the backward pass (line {saved[0]}: "
                f"{saved[1]}): `backward()` raises 'one of the variables needed for "
                "gradient computation has been modified by an inplace operation'"
            )
        self.found.append(
            (
                node,
                f"`{text}` modifies `{name}` in place, but {consequence}",
                f"compute a new tensor instead (`{name} = {name} + ...`)",
            )
        )
