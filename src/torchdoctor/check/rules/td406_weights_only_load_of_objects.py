from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar

from torchdoctor.check.analysis.scope_index import assignments, own_nodes
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules._unpicklable import Finder
from torchdoctor.check.tree_walk import walk

_SAVES = frozenset({"torch.save", "torch.serialization.save"})
_LOADS = frozenset({"torch.load", "torch.serialization.load"})
_MODEL_NAME = re.compile(r"model|net|network|\w*_(model|net)", re.IGNORECASE)
_MODULE_METHODS = frozenset({"cpu", "to", "cuda", "eval", "half", "float", "module"})
# Packages whose classes an annotation may name that are not the project's.
_NOT_PROJECT = frozenset({"torch", "numpy", "typing", "collections", "builtins"})
# Bases whose objects weights_only loads, or may (a tensor subclass, a typed dict).
_DATA_BASE = re.compile(r"Tensor|Parameter|TypedDict|\bdict\b|torch\.")


@dataclass(frozen=True)
class _Save:
    call: ast.Call
    scope: ast.AST  # the function (or module) the save is in
    path: str  # the text of the file argument
    path_node: ast.expr
    whole: str | None  # what non-tensor object the whole saved value is, if one
    keys: dict[str, str]  # dict key -> what non-tensor object its value is


class WeightsOnlyLoadOfObjects(Rule):
    """`torch.load` under the `weights_only=True` default of a file holding Python objects.

    ## What it does
    Finds `torch.load(...)` without `weights_only=` of a file that this file writes with
    `torch.save` holding objects other than tensors, numbers, strings and plain
    containers: a whole module, a NumPy array, an `argparse.Namespace` (`args` from
    `parse_args()`), an instance of a class of the project (built here, or a name
    declared as one: `box: Boxed = wrap(data, Boxed)`, `Boxed` a plain class of any
    file of the project). The save and the load are
    matched by the file expression (`torch.save(x, path)` ... `torch.load(path)`; a
    formatted name read back matches the literal names it can be: `cache / f"{split}_ds"`
    reads what `cache / "train_ds"` wrote) or by
    the keys the loaded dict is read with (`ckpt["args"]` where a saved dict has
    `"args": args`), or, in two methods of one class, by paths from the same method
    (`path = self._file(key)`). A saved `obj: T` of a generic class holds what the
    project builds that class with (`Store[Record](...)`, a class of the project).
    Quiet when the file registers safe globals (`add_safe_globals`, `safe_globals`) or
    the configured `target-version` is older than torch 2.6.

    ## Why is this bad?
    Since torch 2.6 `torch.load` defaults to `weights_only=True`, which unpickles only
    tensors and plain data. Loading such a file fails with `UnpicklingError: Weights
    only load failed ... Unsupported global: GLOBAL argparse.Namespace` (or
    `numpy.core.multiarray._reconstruct`, or the model's class): the code worked when
    written and breaks on upgrading torch. On by default: the load always fails.

    ## Example
    ```python
    torch.save({"model": model.state_dict(), "args": args}, "ckpt.pt")
    ckpt = torch.load("ckpt.pt")
    ```

    ## Use instead
    ```python
    torch.save({"model": model.state_dict(), "args": vars(args)}, "ckpt.pt")
    ckpt = torch.load("ckpt.pt")
    ```
    or, for your own trusted files, `torch.load(path, weights_only=False)`, or
    `torch.serialization.add_safe_globals([argparse.Namespace])`.

    ## Fix safety
    No fix is offered: `weights_only=False` is safe only for trusted files (TD403).

    ## References
    - https://pytorch.org/docs/stable/notes/serialization.html#weights-only
    - https://pytorch.org/docs/stable/generated/torch.load.html
    """

    code = "TD406"
    name = "weights-only-load-of-objects"
    category = "checkpoint"
    severity = Severity.ERROR
    triggers: ClassVar[tuple[str, ...]] = ("save", "load")

    def finish(self) -> None:
        if self.ctx.target_version is not None and not self.ctx.targets_torch_at_least(2, 6):
            return
        source = self.ctx.source
        if "safe_globals" in source or "save(" not in source or "load(" not in source:
            return  # a safe-globals registry, or not both a save and a load to match
        # every (scope, file expression) `torch.save` writes to, with the line
        self.written: list[tuple[ast.AST, str, int, ast.expr]] = []
        saves: list[_Save] = []
        loads: list[tuple[ast.Call, ast.AST]] = []
        for scope in walk(self.ctx.tree):
            if not isinstance(scope, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            for node in own_nodes(self.ctx, scope):
                if not isinstance(node, ast.Call):
                    continue
                name = self.ctx.qualname(node.func) or ""
                if name in _SAVES:
                    path = node.args[1] if len(node.args) > 1 else _keyword(node, "f")
                    if path is not None:
                        self.written.append((scope, self.ctx.segment(path), node.lineno, path))
                    save = self._save(node, scope)
                    if save is not None:
                        saves.append(save)
                elif name in _LOADS and not any(
                    k.arg in ("weights_only", "pickle_module") for k in node.keywords
                ):
                    loads.append((node, scope))
        if not saves:
            return
        for load, scope in loads:
            self._match(load, scope, saves)

    # -- saves ------------------------------------------------------------
    def _save(self, call: ast.Call, scope: ast.AST) -> _Save | None:
        obj = call.args[0] if call.args else _keyword(call, "obj")
        path = call.args[1] if len(call.args) > 1 else _keyword(call, "f")
        if obj is None or path is None:
            return None
        finder = Finder(self.ctx, scope)
        if isinstance(obj, ast.Name):
            bound = finder.binding(obj.id, call.lineno)
            if isinstance(bound, ast.Dict):
                obj = bound
        keys: dict[str, str] = {}
        whole = None
        if isinstance(obj, ast.Dict):
            for key, value in zip(obj.keys, obj.values, strict=True):
                what = self._object(value, scope, call.lineno)
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and what:
                    keys[key.value] = what
                whole = whole or what
        else:
            whole = self._object(obj, scope, call.lineno)
        if whole is None:
            return None
        return _Save(call, scope, self.ctx.segment(path), path, whole, keys)

    def _object(self, value: ast.expr, scope: ast.AST, line: int, depth: int = 2) -> str | None:
        """What non-tensor object `value` is ("an `argparse.Namespace`", ...), if known."""
        if depth < 0:
            return None
        if isinstance(value, ast.Call):
            name = self.ctx.qualname(value.func) or ""
            if name.startswith("numpy.") and name.rsplit(".", 1)[-1][:1].islower():
                return f"a NumPy array (`{self.ctx.segment(value.func)}(...)`)"
            if isinstance(value.func, ast.Attribute):
                if value.func.attr == "numpy":
                    return "a NumPy array (`.numpy()`)"
                if value.func.attr == "parse_args":
                    return "an `argparse.Namespace`"
                if value.func.attr in _MODULE_METHODS:
                    return self._object(value.func.value, scope, line, depth)
            if self._is_class_of_file(name):
                return f"a `{name}` object"
            return None
        if isinstance(value, ast.Name):
            if value.id == "self":
                cls = _enclosing_class(self.ctx.tree, scope)
                if cls is not None:
                    return f"a `{cls.name}` object (`self`)"
                return None
            declared = self._declared_class(value.id, scope, line)
            if declared is not None:
                return declared
            bound = Finder(self.ctx, scope).binding(value.id, line)
            if bound is not None:
                return self._object(bound, scope, line, depth - 1)
            generic = self._type_argument(value.id, scope)
            if generic is not None:
                return generic
            if scope is not self.ctx.tree and _MODEL_NAME.fullmatch(value.id):
                params = getattr(scope, "args", None)
                if params is not None and any(a.arg == value.id for a in params.args):
                    return f"a whole model (`{value.id}`)"
            return None
        if (
            isinstance(value, ast.Attribute)
            and isinstance(value.value, ast.Name)
            and value.value.id == "self"
        ):
            cls = _enclosing_class(self.ctx.tree, scope)
            return self._attribute_object(cls, value.attr) if cls is not None else None
        return None

    def _declared_class(self, name: str, scope: ast.AST, line: int) -> str | None:
        """`name: Wrapper = ...` before `line`, where `Wrapper` is a plain class of the
        project (defined in this file, or imported under its own name from outside torch,
        and defined in some file of the project): its objects are no tensors."""
        latest: ast.AnnAssign | None = None
        for node in assignments(self.ctx, scope).get(name, ()):
            if node.lineno < line and (latest is None or node.lineno > latest.lineno):
                latest = node if isinstance(node, ast.AnnAssign) else None
        if latest is None or not isinstance(latest.annotation, ast.Name):
            return None
        cls = latest.annotation.id
        target = self.ctx.imports.get(cls)
        if target is None and not self._is_class_of_file(cls):
            return None
        if target is not None and (
            target.split(".", 1)[0] in _NOT_PROJECT or target.rsplit(".", 1)[-1] != cls
        ):
            return None
        bases = self.ctx.project.bases.get(cls)
        if bases is None or any(_DATA_BASE.search(b) for b in bases):
            return None  # not the project's, or a tensor / a typed dict: plain data
        return f"a `{cls}` object (`{name}: {cls}`)"

    def _type_argument(self, name: str, scope: ast.AST) -> str | None:
        """A parameter annotated with a type variable of its generic class (`obj: T` in
        `class Store(Base[T])`), where the project builds that class with one of its own
        classes as the argument (`Store[Record](...)`)."""
        params = getattr(scope, "args", None)
        arg = next((a for a in params.args if a.arg == name), None) if params else None
        if arg is None or not isinstance(arg.annotation, ast.Name):
            return None
        var = arg.annotation.id
        if not _is_type_var(self.ctx.tree, var, self.ctx.qualname):
            return None
        cls = _enclosing_class(self.ctx.tree, scope)
        if cls is None or not any(
            isinstance(base, ast.Subscript)
            and any(isinstance(n, ast.Name) and n.id == var for n in ast.walk(base.slice))
            for base in cls.bases
        ):
            return None
        for argument, path, line in self.ctx.project.generic_arguments.get(cls.name, ()):
            short = argument.rsplit(".", 1)[-1]
            where = os.path.basename(path)
            return (
                f"a `{short}` object (`{name}: {var}`, and {where} line {line} builds "
                f"`{cls.name}[{short}]`)"
            )
        return None

    def _is_class_of_file(self, name: str) -> bool:
        return any(
            isinstance(node, ast.ClassDef) and node.name == name for node in self.ctx.tree.body
        )

    def _attribute_object(self, cls: ast.ClassDef, attr: str) -> str | None:
        """`self.attr` set in `__init__` from a class of this file, or from a parameter
        annotated with one."""
        init = next(
            (m for m in cls.body if isinstance(m, ast.FunctionDef) and m.name == "__init__"),
            None,
        )
        if init is None:
            return None
        annotations = {
            a.arg: self.ctx.segment(a.annotation)
            for a in init.args.args
            if a.annotation is not None
        }
        for node in walk(init):
            if not isinstance(node, ast.Assign) or not any(
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
                and t.attr == attr
                for t in node.targets
            ):
                continue
            value = node.value
            if isinstance(value, ast.Call) and self._is_class_of_file(
                self.ctx.qualname(value.func) or ""
            ):
                return f"a `{self.ctx.segment(value.func)}` object (`self.{attr}`)"
            if isinstance(value, ast.Name) and value.id in annotations:
                annotation = annotations[value.id]
                if self._is_project_class(annotation):
                    return f"a `{annotation}` object (`self.{attr}`)"
        return None

    def _is_project_class(self, annotation: str) -> bool:
        """A class of this file, or imported from the package this file belongs to."""
        if self._is_class_of_file(annotation):
            return True
        target = self.ctx.imports.get(annotation)
        if target is None:
            return False
        package = target.split(".", 1)[0]
        return package != "" and package in re.split(r"[\\/]", self.ctx.path)[:-1]

    # -- loads ------------------------------------------------------------
    def _match(self, load: ast.Call, scope: ast.AST, saves: list[_Save]) -> None:
        source = load.args[0] if load.args else _keyword(load, "f")
        if source is None:
            return
        text = self.ctx.segment(source)
        # The same file expression saved in the same function: the latest save before
        # the load tells what the file holds (`b = io.BytesIO()` in two tests is two files).
        here = [w for w in self.written if w[0] is scope and w[1] == text]
        if here:
            before = [w for w in here if w[2] < load.lineno] or here
            line = max(w[2] for w in before)
            save = next((s for s in saves if s.call.lineno == line and s.scope is scope), None)
            if save is not None:
                self._report(load, save, save.whole or "", f"to `{text}`")
            return
        # A local name of another function is another file (`path` parameters, `b`
        # buffers); those loads are matched by the keys they read only.
        local = isinstance(source, ast.Name) and scope is not self.ctx.tree
        maker = self._path_method(source, scope, load.lineno) if local else None
        for save in saves if maker else ():
            if self._path_method(
                save.path_node, save.scope, save.call.lineno
            ) == maker and _enclosing_class(self.ctx.tree, save.scope) is _enclosing_class(
                self.ctx.tree, scope
            ):
                self._report(load, save, save.whole or "", f"to a path from `self.{maker}(...)`")
                return
        for save in saves:
            if not local and _same_file(save.path_node, source):
                self._report(load, save, save.whole or "", f"to `{save.path}`")
                return
        if any(_same_file(w[3], source) for w in self.written) and not local:
            return  # written here with plain data only
        read = self._keys_read(load, scope)
        for save in saves:
            if _literal(save.path) and _literal(text):
                continue  # two different named files
            for key in read:
                if key in save.keys:
                    self._report(load, save, save.keys[key], f"with the key `{key!r}`")
                    return

    def _path_method(self, path: ast.expr, scope: ast.AST, line: int) -> str | None:
        """`_get_path` for a local name bound to `self._get_path(...)`: two methods of a
        class that take their file paths from the same method of it use one store."""
        if not isinstance(path, ast.Name) or scope is self.ctx.tree:
            return None
        bound = Finder(self.ctx, scope).binding(path.id, line)
        if (
            isinstance(bound, ast.Call)
            and isinstance(bound.func, ast.Attribute)
            and isinstance(bound.func.value, ast.Name)
            and bound.func.value.id == "self"
        ):
            return bound.func.attr
        return None

    def _keys_read(self, load: ast.Call, scope: ast.AST) -> list[str]:
        """The string keys the loaded value is read with (`state["args"]`)."""
        target = None
        for node in own_nodes(self.ctx, scope):
            if isinstance(node, ast.Assign) and node.value is load and len(node.targets) == 1:
                target = node.targets[0]
        if not isinstance(target, ast.Name):
            return []
        return [
            node.slice.value
            for node in own_nodes(self.ctx, scope)
            if isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == target.id
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ]

    def _report(self, load: ast.Call, save: _Save, what: str, how: str) -> None:
        self.report(
            load,
            f"`{self.ctx.segment(load)[:60]}` loads with the `weights_only=True` default "
            f"(torch >= 2.6) a file that `torch.save` at line {save.call.lineno} writes "
            f"{how}, holding {what}: UnpicklingError: Weights only load failed",
            hint="save plain data (`state_dict()`, `vars(args)`, tensors), or load your own "
            "trusted file with `weights_only=False` / `add_safe_globals([...])`",
        )


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg == name), None)


def _is_type_var(tree: ast.Module, name: str, qualname: Callable[[ast.expr], str | None]) -> bool:
    """`name = TypeVar("name")` at module level."""
    return any(
        isinstance(stmt, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
        and isinstance(stmt.value, ast.Call)
        and (qualname(stmt.value.func) or "").rsplit(".", 1)[-1] == "TypeVar"
        for stmt in tree.body
    )


def _enclosing_class(tree: ast.Module, scope: ast.AST) -> ast.ClassDef | None:
    for node in walk(tree):
        if isinstance(node, ast.ClassDef) and any(m is scope for m in node.body):
            return node
    return None


def _same_file(saved: ast.AST, loaded: ast.AST) -> bool:
    """The two file expressions name the same file: written alike, where a formatted
    name read back may stand for a literal one written (`cache / f"{tag}_data"` reads
    what `cache / "train_data"` wrote)."""
    if isinstance(loaded, ast.JoinedStr) and isinstance(saved, ast.Constant):
        return isinstance(saved.value, str) and _template(loaded).fullmatch(saved.value) is not None
    if type(saved) is not type(loaded):
        return False
    if isinstance(saved, ast.Constant):  # (not ast.dump: its recursive closure is a cycle)
        value = loaded.value  # type: ignore[attr-defined]
        return type(saved.value) is type(value) and saved.value == value
    for (_, a), (_, b) in zip(ast.iter_fields(saved), ast.iter_fields(loaded), strict=True):
        if isinstance(a, list) and isinstance(b, list):
            if len(a) != len(b) or not all(map(_same_file, a, b)):
                return False
        elif isinstance(a, ast.AST) and isinstance(b, ast.AST):
            if not _same_file(a, b):
                return False
        elif a != b:
            return False
    return True


def _template(text: ast.JoinedStr) -> re.Pattern[str]:
    """The names an f-string can give: its literal parts, anything for each field."""
    parts = [re.escape(str(v.value)) if isinstance(v, ast.Constant) else ".+" for v in text.values]
    return re.compile("".join(parts), re.DOTALL)


def _literal(text: str) -> bool:
    """A file named by a plain string literal (`"ckpt.pt"`)."""
    return text[:1] in "'\"" and text[-1:] == text[:1]
