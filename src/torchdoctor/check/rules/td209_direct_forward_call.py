from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING, ClassVar

from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.tree_walk import walk_statements

if TYPE_CHECKING:
    from torchdoctor.check.context import FileContext

# Receivers whose `.forward` is an RPC proxy's method, not a local module's.
_REMOTE = re.compile(r"rpc_sync|rpc_async|remote|rref", re.IGNORECASE)
# Objects that have a `forward` but are no nn.Module (hook objects, plain functions),
# or FX graph modules that compiler code runs directly, hooks-free by construction.
_NOT_A_MODULE = re.compile(r"hook|func|(^|_)fn($|_)|(^|_)gm$|graph_module|^_c$", re.IGNORECASE)
# What the file shows that puts hooks on modules: hook registration and the tools that
# work through hooks. Without any, `.forward()` and `__call__` compute the same thing.
_HOOKS = re.compile(
    r"register_\w*hook|register_parametrization|parametrizations\.|spectral_norm|weight_norm"
    r"|prune\.|quant_noise|FullyShardedDataParallel|fully_shard|FSDP|checkpoint_wrapper|quantization\.prepare"
    r"|prepare_qat|prepare_fx|\bhooks\b"
)
_EXPECTS_ERROR = re.compile(r"raises|assertRaises", re.IGNORECASE)
# Libraries whose models also have a `.forward` (OpenCV DNN, TensorFlow, ONNX...):
# a file that uses none of these torch-side roots and defines no module is skipped.
_TORCH_ROOTS = frozenset(
    {"torch", "lightning", "pytorch_lightning", "transformers", "timm", "torchvision"}
)


class DirectForwardCall(Rule):
    """`model.forward(x)` instead of `model(x)`: skips hooks and wrapper logic.

    ## What it does
    Finds calls of `.forward(...)` on a module object from outside that module,
    such as `model.forward(x)`, `net.encoder.forward(x)` or
    `ddp_model.module.forward(x)`, in a file that shows hooks on modules: hooks
    registered (`register_forward_hook`, `register_forward_pre_hook`, ...) or
    tools that work through hooks (`spectral_norm`, `weight_norm`,
    parametrizations, pruning, FSDP, quantization preparation, `quant_noise`).
    Where the file shows no hook, `model.forward(x)` computes what `model(x)`
    does and the rule stays quiet: a test calling `forward` on a model it just
    built, a tutorial's plain network.

    It leaves alone the calls that must name `forward`: `super().forward(x)` and
    `Base.forward(self, x)` inside a subclass, `self.forward(...)` inside the
    class's own methods, `MyFunction.forward(ctx, ...)` of an autograd Function,
    `forward` functions of compiled extension modules (`my_ext_cuda.forward`),
    methods of RPC proxies (`rref.rpc_sync().forward(x)`,
    `remote_module.forward(x)`), which have no `__call__`, and `net.forward()`
    with no argument at all: OpenCV DNN and TensorFlow nets run on an input set
    beforehand (`net.setInput(blob)`), a module's forward takes its input.

    ## Why is this bad?
    `model(x)` runs `Module.__call__`, which runs the registered forward
    pre-hooks and hooks (and the backward hooks) around `forward`. Calling
    `forward` directly skips all of them: hook-based tools silently stop
    working — activation checkpoint wrappers, `torch.nn.utils.parametrize`
    and `spectral_norm`/`weight_norm`-style reparametrisations done in
    pre-hooks, FSDP's parameter all-gather, quantization observers, pruning
    masks, feature extractors and profilers. Under FSDP this computes with
    sharded (empty) parameters and fails with a size mismatch.

    ## Example
    ```python
    logits = model.forward(images)
    ```

    ## Use instead
    ```python
    logits = model(images)
    ```

    ## References
    - https://pytorch.org/docs/stable/generated/torch.nn.Module.html#torch.nn.Module.forward
    """

    code = "TD209"
    name = "direct-forward-call"
    category = "training"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = (".forward(",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = (ast.Call,)

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._plain: set[str] | None = None
        self._hooks: bool | None = None

    def visit_words(self) -> tuple[str, ...]:
        return ("forward",)  # `visit` reports `x.forward(...)` only

    def visit(self, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        func = node.func
        if not isinstance(func, ast.Attribute) or func.attr != "forward":
            return
        if not node.args and not node.keywords:
            return  # OpenCV / TensorFlow nets run `net.forward()` on a set input; modules take one
        receiver = func.value
        if (
            not self._torch_file()
            or not self._hooks_in_file()
            or self._deliberate(receiver)
            or self._expects_error()
            or self._in_torchscript()
            or self._built_as_non_module(receiver)
        ):
            return
        text = self.ctx.segment(receiver)
        if len(text) > 40:
            text = text[:37] + "..."
        self.report(
            node,
            f"`{text}.forward(...)` bypasses `Module.__call__`: forward hooks, "
            "pre-hooks and wrapper logic (FSDP, parametrizations, quantization "
            f"observers) do not run; call `{text}(...)`",
            hint=f"call the module itself: `{text}(...)`",
        )

    def _torch_file(self) -> bool:
        """The file imports torch (or a torch library) or a module class of the project."""
        roots = {target.split(".", 1)[0] for target in self.ctx.imports.values()}
        if roots & _TORCH_ROOTS:
            return True
        return any(name in self.ctx.project.module_classes for name in self.ctx.imports)

    def _hooks_in_file(self) -> bool:
        """The file registers hooks or uses a tool that works through them."""
        if self._hooks is None:
            self._hooks = _HOOKS.search(self.ctx.source) is not None
        return self._hooks

    def _in_torchscript(self) -> bool:
        """TorchScript calls module interfaces through `.forward` by design."""
        function = self.ctx.enclosing_function()
        return function is not None and any(
            "script" in self.ctx.segment(d) for d in function.decorator_list
        )

    def _built_as_non_module(self, receiver: ast.expr) -> bool:
        """`m = MyHelper()` in the same function, with `MyHelper` a class of this
        file that is no nn.Module (or a lite-interpreter module)."""
        if not isinstance(receiver, ast.Name):
            return False
        scope = self.ctx.enclosing_function() or self.ctx.tree
        for sub in walk_statements(scope):
            if not (
                isinstance(sub, ast.Assign)
                and isinstance(sub.value, ast.Call)
                and any(isinstance(t, ast.Name) and t.id == receiver.id for t in sub.targets)
            ):
                continue
            callee = self.ctx.qualname(sub.value.func) or ""
            last = callee.rsplit(".", 1)[-1]
            if "lite_interpreter" in callee:
                return True
            if last in self._plain_classes():
                return True
        return False

    def _plain_classes(self) -> set[str]:
        """Classes of this file that are not nn.Module subclasses (judged by their own
        bases: another file may define a module class of the same name)."""
        if self._plain is None:
            self._plain = {
                c.name
                for c in walk_statements(self.ctx.tree)
                if isinstance(c, ast.ClassDef)
                and not any(
                    self.ctx.project.is_module_class_name(self.ctx.qualname(base) or "")
                    for base in c.bases
                )
            }
        return self._plain

    def _expects_error(self) -> bool:
        """Inside `with pytest.raises(...)` / `self.assertRaises(...)`."""
        for node in self.ctx.stack:
            if isinstance(node, ast.With) and any(
                _EXPECTS_ERROR.search(self.ctx.segment(item.context_expr)) for item in node.items
            ):
                return True
        return False

    def _deliberate(self, receiver: ast.expr) -> bool:
        # super().forward(x), super(Net, self).forward(x), type(m).forward(self, x)
        if isinstance(receiver, ast.Call) and getattr(receiver.func, "id", None) in (
            "super",
            "type",
        ):
            return True
        if _REMOTE.search(self.ctx.segment(receiver)) or self._iterates_remote(receiver):
            return True  # RPC proxies only offer methods
        last = receiver.id if isinstance(receiver, ast.Name) else getattr(receiver, "attr", "")
        if _NOT_A_MODULE.search(last):
            return True
        if isinstance(receiver, ast.Name):
            if receiver.id in ("self", "cls", "ctx"):
                return True  # the class's own method, or an autograd Function's context
            if receiver.id in self.ctx.imports:
                # an imported module or class: `my_ext_cuda.forward`, `Base.forward(self)`
                return True
            # a class of the checked project: `MyFunction.forward(ctx, x)`
            return receiver.id in self.ctx.project.bases
        if isinstance(receiver, ast.Attribute):
            # an imported class: `nn.Linear.forward(self, x)`, `fairseq.Model.forward(...)`
            root: ast.expr = receiver
            while isinstance(root, ast.Attribute):
                root = root.value
            return (
                isinstance(root, ast.Name)
                and root.id in self.ctx.imports
                and receiver.attr[:1].isupper()
            )
        return False

    def _iterates_remote(self, receiver: ast.expr) -> bool:
        """`for m in remote_modules: m.forward()` and its comprehension forms."""
        if not isinstance(receiver, ast.Name):
            return False
        for node in self.ctx.stack:
            loops: list[ast.comprehension | ast.For] = []
            if isinstance(node, ast.For):
                loops.append(node)
            elif isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
                loops.extend(node.generators)
            for loop in loops:
                if (
                    isinstance(loop.target, ast.Name)
                    and loop.target.id == receiver.id
                    and _REMOTE.search(self.ctx.segment(loop.iter))
                ):
                    return True
        return False
