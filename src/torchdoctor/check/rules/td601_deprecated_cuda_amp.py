from __future__ import annotations

import ast
import re
from typing import ClassVar

from torchdoctor.check.lines import line_start
from torchdoctor.check.rule import Edit, Fix, FixAvailability, Rule, Severity
from torchdoctor.check.tree_walk import walk, walk_statements

# deprecated name -> (device type, replacement under torch.amp)
_DEPRECATED: dict[str, tuple[str, str]] = {
    "torch.cuda.amp.autocast": ("cuda", "autocast"),
    "torch.cuda.amp.autocast_mode.autocast": ("cuda", "autocast"),
    "torch.cuda.amp.GradScaler": ("cuda", "GradScaler"),
    "torch.cuda.amp.grad_scaler.GradScaler": ("cuda", "GradScaler"),
    "torch.cuda.amp.custom_fwd": ("cuda", "custom_fwd"),
    "torch.cuda.amp.autocast_mode.custom_fwd": ("cuda", "custom_fwd"),
    "torch.cuda.amp.custom_bwd": ("cuda", "custom_bwd"),
    "torch.cuda.amp.autocast_mode.custom_bwd": ("cuda", "custom_bwd"),
    "torch.cpu.amp.autocast": ("cpu", "autocast"),
    "torch.cpu.amp.autocast_mode.autocast": ("cpu", "autocast"),
    "torch.cpu.amp.GradScaler": ("cpu", "GradScaler"),
    "torch.cpu.amp.grad_scaler.GradScaler": ("cpu", "GradScaler"),
}
_LAST_NAMES = frozenset({"autocast", "GradScaler", "custom_fwd", "custom_bwd"})
# The old autocast's positional parameters, which torch.amp.autocast orders differently.
_AUTOCAST_POSITIONAL = ("enabled", "dtype", "cache_enabled")
_TYPE_CHECKS = frozenset({"isinstance", "issubclass"})
_VERSION_CHECK = re.compile(r"version|hasattr|getattr", re.IGNORECASE)


class DeprecatedCudaAmp(Rule):
    """`torch.cuda.amp.autocast` / `GradScaler`: deprecated; use `torch.amp` with a device.

    ## What it does
    Finds uses of the device-specific AMP API: `torch.cuda.amp.autocast`,
    `torch.cuda.amp.GradScaler`, `torch.cuda.amp.custom_fwd` / `custom_bwd`,
    `torch.cpu.amp.autocast` and `torch.cpu.amp.GradScaler`, whether written out
    or imported (`from torch.cuda.amp import autocast, GradScaler`).

    Left alone: the old-torch branch of a version switch (`if
    is_torch_version(">=", "2.3"): ... else: torch.cuda.amp.GradScaler()`, a
    `hasattr` test, an `except` handler), type checks and annotations
    (`isinstance(s, GradScaler)`, `scaler: GradScaler`), identity tests
    (`func is torch.cuda.amp.autocast`), and projects whose configured
    `target-version` is older than 2.4, where this API is not deprecated yet, or,
    with no `target-version`, whose dependency pins allow no torch 2.4 or newer
    (`torch>=1.10,<2` in setup.py, `torch==2.3.1` as the only torch requirement).

    ## Why is this bad?
    Since PyTorch 2.4 each of them emits
    `FutureWarning: torch.cuda.amp.autocast(args...) is deprecated. Please use
    torch.amp.autocast('cuda', args...) instead.` on every call (a warning per
    training step for `autocast`), and they are scheduled for removal. They also
    tie the script to one device type, where `torch.amp` takes the device as an
    argument, so one code path serves CUDA, CPU, MPS and XPU.

    ## Example
    ```python
    from torch.cuda.amp import GradScaler, autocast

    scaler = GradScaler()
    with autocast(dtype=torch.float16):
        loss = model(x)
    ```

    ## Use instead
    ```python
    scaler = torch.amp.GradScaler("cuda")
    with torch.amp.autocast("cuda", dtype=torch.float16):
        loss = model(x)
    ```

    ## Fix safety
    The fix is safe: it calls `torch.amp.autocast("cuda", ...)` /
    `torch.amp.GradScaler("cuda", ...)` / `torch.amp.custom_fwd(device_type="cuda",
    ...)` (`"cpu"` for the `torch.cpu.amp` forms), which the deprecated functions
    forward to, with the same defaults. Positional arguments of the old
    `autocast(enabled, dtype, cache_enabled)` become keywords, because
    `torch.amp.autocast` orders its parameters differently. Calls through an
    imported name (`autocast(...)`) are rewritten to the full `torch.amp.` path,
    adding `import torch` next to the old import if the file lacks it; the old
    `from torch.cuda.amp import ...` line is left for your linter (ruff F401) to
    remove once unused. Uses that are not calls (`ctx = autocast if amp else
    nullcontext`) are reported without a fix.

    ## References
    - https://pytorch.org/docs/stable/amp.html
    """

    code = "TD601"
    name = "deprecated-cuda-amp"
    category = "deprecation"
    severity = Severity.INFO
    fix_availability = FixAvailability.SAFE
    triggers: ClassVar[tuple[str, ...]] = ("cuda.amp", "cpu.amp")
    node_types: ClassVar[tuple[type[ast.AST], ...]] = (ast.Call, ast.Attribute, ast.Name)

    def visit_words(self) -> tuple[str, ...]:
        # the API's last name, or the local name an import gives it
        aliases = [k for k, v in self.ctx.imports.items() if v.rsplit(".", 1)[-1] in _LAST_NAMES]
        return (*_LAST_NAMES, *aliases)

    def visit(self, node: ast.AST) -> None:
        if not self.ctx.torch_may_be_at_least(2, 4):
            return  # deprecated in 2.4; older torch may need exactly this API
        if isinstance(node, ast.Call):
            self._visit_call(node)
            return
        deprecated = self._deprecated(node)
        if deprecated is None:
            return
        name, (device, new) = deprecated
        if not self._bare_reference(node, new) or self._version_fallback():
            return
        decorator = self._decorated_by(node)
        if decorator is not None and new in ("custom_fwd", "custom_bwd"):
            prefix, extra = self._torch_prefix(node)
            fix = self.ctx.fix(
                f'use `@torch.amp.{new}(device_type="{device}")`',
                self.ctx.replace(node, f'{prefix}amp.{new}(device_type="{device}")'),
                *extra,
            )
            self.report(node, self._message(name, device, new), fix=fix)
            return
        self.report(node, self._message(name, device, new))

    # -- calls ---------------------------------------------------------------------------
    def _visit_call(self, call: ast.Call) -> None:
        deprecated = self._deprecated(call.func)
        if deprecated is None or self._version_fallback():
            return
        name, (device, new) = deprecated
        self.report(call, self._message(name, device, new), fix=self._fix_call(call, device, new))

    def _fix_call(self, call: ast.Call, device: str, new: str) -> Fix | None:
        if any(isinstance(a, ast.Starred) for a in call.args):
            return None
        prefix, extra = self._torch_prefix(call.func)
        edits: list[Edit] = [self.ctx.replace(call.func, f"{prefix}amp.{new}"), *extra]
        names: tuple[str, ...] = ()
        lead = f'"{device}"'
        if new == "autocast":
            if len(call.args) > len(_AUTOCAST_POSITIONAL):
                return None
            names = _AUTOCAST_POSITIONAL
        elif new != "GradScaler":  # custom_fwd / custom_bwd take keywords only
            if call.args:
                return None
            lead = f'device_type="{device}"'
        arguments: list[ast.expr | ast.keyword] = [*call.args, *call.keywords]
        arguments.sort(key=lambda n: (n.lineno, n.col_offset))
        if not arguments:
            close = self.ctx.node_span(call)[1] - 1
            if self.ctx.source[close] != ")":
                return None
            edits.append(Edit(close, close, lead))
        else:
            first = self.ctx.node_span(arguments[0])[0]
            indent = self.ctx.source[line_start(self.ctx.source, first) : first]
            # one argument per line stays one argument per line
            separator = f",\n{indent}" if indent.isspace() else ", "
            inserts = {first: f"{lead}{separator}"}
            for position, arg in zip(names, call.args, strict=False):
                start = self.ctx.node_span(arg)[0]
                inserts[start] = inserts.get(start, "") + f"{position}="
            edits.extend(Edit(at, at, text) for at, text in inserts.items())
        return self.ctx.fix(f'use `torch.amp.{new}` with "{device}"', *edits)

    # -- names ---------------------------------------------------------------------------
    def _deprecated(self, node: ast.AST) -> tuple[str, tuple[str, str]] | None:
        if isinstance(node, ast.Attribute):
            if node.attr not in _LAST_NAMES:
                return None
        elif isinstance(node, ast.Name):
            target = self.ctx.imports.get(node.id)
            if target is None or target.rsplit(".", 1)[-1] not in _LAST_NAMES:
                return None
        else:
            return None
        name = self.ctx.qualname(node)
        if name is None or name not in _DEPRECATED:
            return None
        return name, _DEPRECATED[name]

    def _torch_prefix(self, node: ast.AST) -> tuple[str, list[Edit]]:
        """`torch.` (or the file's alias, `T.`) for the replacement, plus an edit adding
        `import torch` beside the old import when the file has no alias for torch."""
        root: ast.AST = node
        while isinstance(root, ast.Attribute):
            root = root.value
        if isinstance(root, ast.Name) and self.ctx.imports.get(root.id) == "torch":
            return f"{root.id}.", []
        for alias, target in self.ctx.imports.items():
            if target == "torch":
                return f"{alias}.", []
        importer = self._import_statement(root)
        if importer is None:
            return "torch.", []
        start = self.ctx.offset(importer.lineno, importer.col_offset)
        indent = " " * importer.col_offset
        return "torch.", [Edit(start, start, f"import torch\n{indent}")]

    def _import_statement(self, root: ast.AST) -> ast.stmt | None:
        """The statement importing the name `root` stands for."""
        if not isinstance(root, ast.Name):
            return None
        for stmt in walk_statements(self.ctx.tree):
            if isinstance(stmt, ast.ImportFrom | ast.Import) and any(
                (alias.asname or alias.name.split(".", 1)[0]) == root.id for alias in stmt.names
            ):
                return stmt
        return None

    def _bare_reference(self, node: ast.AST, new: str) -> bool:
        """A use that is not a call: `ctx = autocast if amp else nullcontext`, a bare
        `@custom_fwd` decorator. Type checks, annotations and GradScaler classes used
        as types (`isinstance(s, GradScaler)`, `scaler: GradScaler`) warn nothing."""
        parent = self.ctx.stack[-1] if self.ctx.stack else None
        if isinstance(parent, ast.Attribute):
            return False  # part of a longer name: only the outer chain counts
        if isinstance(parent, ast.Call) and parent.func is node:
            return False  # a call: handled by _visit_call
        if new == "GradScaler":
            return False
        if isinstance(parent, ast.List | ast.Tuple | ast.Set | ast.Dict):
            return False  # a table of functions (`func in [torch.cuda.amp.autocast, ...]`)
        for ancestor in self.ctx.stack:
            if isinstance(ancestor, ast.Compare):
                return False  # `func is torch.cuda.amp.autocast` identifies, calls nothing
            if isinstance(ancestor, ast.Call) and self.ctx.call_name(ancestor) in _TYPE_CHECKS:
                return False
            annotation = getattr(ancestor, "annotation", None) or getattr(ancestor, "returns", None)
            if annotation is not None and _contains(annotation, node):
                return False
        return True

    def _version_fallback(self) -> bool:
        """The old-torch branch of a version switch: `if is_torch_version(">=", "2.3"):
        ...torch.amp... else: torch.cuda.amp.GradScaler()`, `hasattr(torch, "amp")`, or
        the handler of a `try` around the new API."""
        for depth, ancestor in enumerate(self.ctx.stack):
            if isinstance(ancestor, ast.If | ast.IfExp):
                if _VERSION_CHECK.search(self.ctx.segment(ancestor.test)):
                    return True
            elif isinstance(ancestor, ast.ExceptHandler):
                return True
            elif isinstance(ancestor, ast.Try) and depth + 1 < len(self.ctx.stack):
                child = self.ctx.stack[depth + 1]
                if any(child is stmt for stmt in ancestor.orelse):
                    return True
        return False

    def _decorated_by(self, node: ast.AST) -> ast.AST | None:
        parent = self.ctx.stack[-1] if self.ctx.stack else None
        if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef) and any(
            d is node for d in parent.decorator_list
        ):
            return parent
        return None

    @staticmethod
    def _message(name: str, device: str, new: str) -> str:
        if new in ("custom_fwd", "custom_bwd"):
            replacement = f'torch.amp.{new}(device_type="{device}")'
        else:
            replacement = f'torch.amp.{new}("{device}", ...)'
        return f"`{name}` is deprecated (a FutureWarning on every call); use `{replacement}`"


def _contains(tree: ast.AST, node: ast.AST) -> bool:
    return any(sub is node for sub in walk(tree))
