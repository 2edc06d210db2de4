from __future__ import annotations

import ast
import re
from dataclasses import dataclass
from typing import ClassVar

from torchdoctor.check.analysis.class_calls import parameter_attributes, project_class
from torchdoctor.check.analysis.file_loops import FileLoops, analysis
from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.grad_contexts import is_no_grad_decorated, with_item_context
from torchdoctor.check.analysis.names import is_torch_file
from torchdoctor.check.analysis.syntax import dotted
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules._inplace_text import may_write_leaf
from torchdoctor.check.tree_walk import walk

# Tensor methods that write into the tensor itself.
_INPLACE = frozenset(
    {
        "add_",
        "sub_",
        "mul_",
        "div_",
        "zero_",
        "fill_",
        "copy_",
        "clamp_",
        "clamp_min_",
        "clamp_max_",
        "normal_",
        "uniform_",
        "addcmul_",
        "addcdiv_",
        "lerp_",
        "masked_fill_",
        "index_add_",
        "index_fill_",
        "scatter_",
        "scatter_add_",
        "pow_",
        "sqrt_",
        "exp_",
        "abs_",
        "neg_",
        "sign_",
        "clip_",
        "fmod_",
        "renorm_",
        "t_",
        "squeeze_",
        "unsqueeze_",
        "resize_",
        "set_",
        "bernoulli_",
        "exponential_",
        "random_",
        "geometric_",
        "cauchy_",
        "log_normal_",
    }
)
_LEAF_WORDS = ("requires_grad", "Parameter(", "parameters()")
# `head = SoftmaxHead(...)`: an instance of a class whose attributes may be parameters
_BUILDS = re.compile(r"=\s*(?:\w+\.)*([A-Z]\w*)\(")
_PARAMETER_CLASSES = frozenset({"torch.nn.Parameter", "torch.nn.parameter.Parameter", "Parameter"})


@dataclass(frozen=True)
class Leaf:
    key: str
    line: int
    how: str  # "created with `requires_grad=True`", "a parameter of `model`", ...


class InplaceOnLeaf(Rule):
    """An in-place update of a parameter or `requires_grad=True` leaf outside `no_grad`.

    ## What it does
    Finds in-place writes -- `w -= lr * w.grad`, `w += x`, `w.add_(...)`,
    `w.mul_(...)`, `w.zero_()`, `w[i] = v`, ... -- to a tensor that is a leaf of
    the autograd graph and requires grad, outside `torch.no_grad()` (or a function
    decorated with it):

    - a tensor made in the same function with `requires_grad=True`,
      `.requires_grad_()` or `nn.Parameter(...)`;
    - a parameter from `for p in model.parameters():` in a function that also runs
      `backward()` (a hand-written update step);
    - a `self.weight = nn.Parameter(...)` updated in the module's `forward`;
    - a parameter attribute of an object built in the function from a module class of
      the project (`head = ScoreHead(...)`, `head.bias[i] = -1e4`), the class defined
      in the file or in the module it is imported from.

    Writes inside `pytest.raises(...)` / `assertRaises(...)` expect the error.

    Updates of `p.data` or `p.grad` are not in-place updates of the leaf itself.

    ## Why is this bad?
    Autograd refuses it. The line raises
    `RuntimeError: a leaf Variable that requires grad is being used in an in-place
    operation.` -- at the first training step, after the data pipeline and the
    model have been set up. Optimizers, `nn.init` functions and hand-written SGD
    steps all do these updates inside `torch.no_grad()`, which tells autograd not
    to record them.

    ## Example
    ```python
    w = torch.randn(3, requires_grad=True)
    loss = (x @ w).pow(2).mean()
    loss.backward()
    w -= 0.1 * w.grad
    ```

    ## Use instead
    ```python
    with torch.no_grad():
        w -= 0.1 * w.grad
        w.grad = None
    ```

    ## References
    - https://pytorch.org/docs/stable/notes/autograd.html#in-place-operations-with-autograd
    - https://pytorch.org/docs/stable/generated/torch.no_grad.html
    """

    code = "TD213"
    name = "inplace-on-leaf"
    category = "training"
    severity = Severity.ERROR
    # the words of a leaf made here, or an in-place write (to a parameter of an object
    # built from a class of the project that makes one: `head.b[i] = 0`)
    triggers: ClassVar[tuple[str, ...]] = (
        "requires_grad",
        "Parameter",
        "parameters()",
        "]=",
        "] =",
        "+=",
        "-=",
        "*=",
        "/=",
        "_(",
    )

    def finish(self) -> None:
        # class -> its parameter attributes (the classes stay alive while the file is checked)
        self._params: dict[int, dict[str, tuple[str, int]]] = {}
        src = self.ctx.source
        leafy = any(self.ctx.holds(t) for t in ("requires_grad", "Parameter", "parameters()"))
        built: set[str] = set()
        if self.ctx.project.parameter_classes:
            # cheap: the CapWords calls of the file against the project's classes
            built = {m.group(1) for m in _BUILDS.finditer(src)}
            built &= self.ctx.project.parameter_classes
        if not (leafy or built) or not is_torch_file(src):
            return
        fl = analysis(self.ctx)
        for fi in fl.all_functions():
            text = fi.text
            forward = fi.cls is not None and fi.name == "forward" and "self." in text
            builds = "requires_grad" not in text and any(f"{c}(" in text for c in built)
            if not forward and not builds and not any(t in text for t in _LEAF_WORDS):
                continue  # no leaf made or named here (cheap: substrings before the regex)
            if not may_write_leaf(text):
                continue  # nothing is updated in place here
            if not fi.is_module and is_no_grad_decorated(self.ctx, fi.node):  # type: ignore[arg-type]
                continue
            leaves = self._leaves(fi, self._class_parameters(fl, fi) if forward else {})
            if leaves and not any(event.no_grad for _, event in fl.callers(fi)):
                _Walker(self, fi, leaves).run()

    def _class_parameters(self, fl: FileLoops, forward: FunctionInfo) -> dict[str, int]:
        """{`self.w`: line} for every `self.w = nn.Parameter(...)` in the method's class."""
        found: dict[str, int] = {}
        cls = forward.cls
        if cls is None or "Parameter" not in self.ctx.segment(cls):
            return found
        for method in fl.methods.get(cls.name, {}).values():
            for stmt in method.own_statements():
                if (
                    isinstance(stmt, ast.Assign)
                    and isinstance(stmt.value, ast.Call)
                    and self.ctx.qualname(stmt.value.func) in _PARAMETER_CLASSES
                ):
                    for target in stmt.targets:
                        key = dotted(target)
                        if key and key.startswith("self."):
                            found[key] = stmt.lineno
        return found

    def _leaves(self, fi: FunctionInfo, class_params: dict[str, int]) -> list[Leaf]:
        leaves: list[Leaf] = []
        trains = "backward" in fi.text
        for stmt in fi.own_statements():
            if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                key = dotted(stmt.targets[0])
                how = self._leaf_value(stmt.value)
                if key and how:
                    leaves.append(Leaf(key, stmt.lineno, how))
                elif key and "requires_grad" not in fi.text:
                    leaves.extend(self._instance_parameters(fi, key, stmt))
            elif isinstance(stmt, ast.For) and trains:
                it = stmt.iter
                if (
                    isinstance(it, ast.Call)
                    and isinstance(it.func, ast.Attribute)
                    and it.func.attr in ("parameters", "named_parameters")
                    and "requires_grad" not in self.ctx.segment(stmt)
                ):
                    target = stmt.target
                    if it.func.attr == "named_parameters" and isinstance(target, ast.Tuple):
                        target = target.elts[-1]
                    key = dotted(target)
                    if key:
                        owner = self.ctx.segment(it.func.value)
                        leaves.append(Leaf(key, stmt.lineno, f"a parameter of `{owner}`"))
        if fi.cls is not None:
            for key, line in class_params.items():
                leaves.append(Leaf(key, line, f"an `nn.Parameter` of `{fi.cls.name}`"))
        return leaves

    def _instance_parameters(self, fi: FunctionInfo, key: str, stmt: ast.Assign) -> list[Leaf]:
        """`head = SoftmaxHead(...)`: `head.b` for each `nn.Parameter` attribute the class
        (here or in the module it is imported from) makes."""
        value = stmt.value
        if not isinstance(value, ast.Call):
            return []
        name = dotted(value.func) or ""
        if name.rsplit(".", 1)[-1] not in self.ctx.project.parameter_classes:
            return []  # cheap first: no class of that name makes a parameter
        if not self.ctx.project.is_module_class_name(self.ctx.qualname(value.func) or name):
            return []
        found = project_class(analysis(self.ctx), name)
        if found is None:
            return []
        owner, cls = found
        params = self._params.get(id(cls))
        if params is None:
            params = self._params[id(cls)] = parameter_attributes(owner, cls)
        where = "" if owner.ctx is self.ctx else f" in {owner.ctx.path.rsplit('/', 1)[-1]}"
        return [
            Leaf(
                f"{key}.{attr}",
                stmt.lineno,
                f"`{attr}` is an `nn.Parameter` of `{cls.name}`, line {line}{where}; "
                f"`{key}` is built",
            )
            for attr, (_path, line) in params.items()
        ]

    def _leaf_value(self, value: ast.expr) -> str | None:
        if not isinstance(value, ast.Call):
            return None
        name = self.ctx.qualname(value.func) or ""
        if name in _PARAMETER_CLASSES:
            requires = next((k.value for k in value.keywords if k.arg == "requires_grad"), None)
            if isinstance(requires, ast.Constant) and requires.value is False:
                return None
            return "an `nn.Parameter`"
        if isinstance(value.func, ast.Attribute) and value.func.attr == "requires_grad_":
            arg = value.args[0] if value.args else None
            if arg is None or (isinstance(arg, ast.Constant) and arg.value is True):
                return "made a leaf with `.requires_grad_()`"
            return None
        for kw in value.keywords:
            if (
                kw.arg == "requires_grad"
                and isinstance(kw.value, ast.Constant)
                and kw.value.value is True
                and name.startswith("torch.")
            ):
                return "created with `requires_grad=True`"
        return None


def _expects_error(expr: ast.expr) -> bool:
    """`pytest.raises(...)`, `self.assertRaises(...)`, `self.assertRaisesRegex(...)`."""
    if not isinstance(expr, ast.Call):
        return False
    name = (dotted(expr.func) or "").rsplit(".", 1)[-1]
    return name in ("raises", "assertRaises", "assertRaisesRegex")


class _Walker:
    """Walks one function tracking no_grad blocks and the latest binding of each leaf."""

    def __init__(self, rule: InplaceOnLeaf, fi: FunctionInfo, leaves: list[Leaf]) -> None:
        self.rule = rule
        self.ctx = rule.ctx
        self.fi = fi
        self.leaves = leaves
        self.keys = {leaf.key for leaf in leaves}
        self.autocast_names = analysis(self.ctx).autocast_names()

    def run(self) -> None:
        self._block(self.fi.body, False)

    def _block(self, stmts: list[ast.stmt], no_grad: bool) -> None:
        for stmt in stmts:
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                continue
            if isinstance(stmt, ast.With | ast.AsyncWith):
                if any(_expects_error(item.context_expr) for item in stmt.items):
                    continue  # `with pytest.raises(RuntimeError):` the error is the test
                inner = no_grad
                for item in stmt.items:
                    gc = with_item_context(self.ctx, item.context_expr, self.autocast_names)
                    if gc.no_grad or gc.grad_switch:
                        inner = True
                self._block(stmt.body, inner)
                continue
            if not no_grad:
                self._check(stmt)
            for name in ("body", "orelse", "finalbody"):
                self._block(getattr(stmt, name, []) or [], no_grad)
            for holder in (*getattr(stmt, "handlers", ()), *getattr(stmt, "cases", ())):
                self._block(holder.body, no_grad)

    def _check(self, stmt: ast.stmt) -> None:
        targets: list[tuple[ast.AST, str, str]] = []  # (node, key, what)
        if isinstance(stmt, ast.AugAssign):
            key = dotted(stmt.target)
            if key:
                targets.append((stmt, key, f"`{self.ctx.segment(stmt)}`"))
            elif isinstance(stmt.target, ast.Subscript):
                key = dotted(stmt.target.value)
                if key:
                    targets.append((stmt, key, f"`{self.ctx.segment(stmt)}`"))
        elif isinstance(stmt, ast.Assign):
            for target in stmt.targets:
                if isinstance(target, ast.Subscript):
                    key = dotted(target.value)
                    if key:
                        targets.append((stmt, key, f"`{self.ctx.segment(stmt)}`"))
        if not isinstance(stmt, ast.If | ast.For | ast.While | ast.Try | ast.Match):
            for node in walk(stmt):
                if (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in _INPLACE
                ):
                    key = dotted(node.func.value)
                    if key:
                        targets.append((node, key, f"`{self.ctx.segment(node)}`"))
        for node, key, what in targets:
            if key not in self.keys:
                continue
            leaf = self._binding(key, getattr(node, "lineno", 0))
            if leaf is None:
                continue
            self.rule.report(
                node,
                f"{what} at line {getattr(node, 'lineno', 0)} updates `{key}` in place, "
                f"a leaf tensor that requires grad ({leaf.how}, line {leaf.line}), outside "
                "`torch.no_grad()`: RuntimeError: a leaf Variable that requires grad is "
                "being used in an in-place operation",
                hint="do the update inside `with torch.no_grad():`",
            )

    def _binding(self, key: str, line: int) -> Leaf | None:
        """The leaf `key` is bound to at `line`, if its latest binding makes one."""
        latest: Leaf | None = None
        latest_line = -1
        for leaf in self.leaves:
            if leaf.key == key and latest_line < leaf.line <= line:
                latest, latest_line = leaf, leaf.line
        if latest is None:
            return None
        # rebound to something else in between (`w = w * 2`)?
        for stmt in self.fi.own_statements():
            if latest_line < stmt.lineno < line and isinstance(stmt, ast.Assign | ast.AnnAssign):
                targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
                bound = [d for t in targets for d in (dotted(t),) if d]
                if any(key == d or key.startswith(d + ".") for d in bound):
                    return None  # `w` or the object holding it (`head = ...`) bound again
        return latest
