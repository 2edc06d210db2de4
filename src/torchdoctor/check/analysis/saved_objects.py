"""What a `torch.save` call writes: the non-tensor objects its value holds, and a key
for the file name it writes to, so that a load in another file can be matched to it.

TD406 asks, in the file (`SavedObjects.save` for each save the file makes) and across
the project (`ProjectIndex.saved_files_for`, filled on demand by `project_saves` for
the files whose text holds a save and the asked key): `torch.load(path)` under the
`weights_only=True` default fails on a file holding a NumPy array, an
`argparse.Namespace` or an object of the project's classes.

A file is named across files by the last part of its path expression, followed
through the names the function binds (`path = os.path.join(root, name)`,
`name = f"{prefix}{KEYS.MODEL}"`): a shared constant (`const:KEYS.MODEL`, the same
dotted name imported in both files) or a literal file name with a stem
(`lit:model.pt`; a bare suffix `f"{epoch}.pt"` names no file).
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Callable
from dataclasses import dataclass

from torchdoctor.check.analysis.cpu_saves import file_saves, keyword, save_path, saved_on_cpu
from torchdoctor.check.analysis.file_loops import sibling_file
from torchdoctor.check.analysis.scope_index import assignments, binding
from torchdoctor.check.context import FileContext
from torchdoctor.check.project import SavedFile
from torchdoctor.check.tree_walk import walk, walk_statements

_MODEL_NAME = re.compile(r"model|net|network|\w*_(model|net)", re.IGNORECASE)
_MODULE_METHODS = frozenset({"cpu", "to", "cuda", "eval", "half", "float", "module"})
# Packages whose classes an annotation may name that are not the project's.
_NOT_PROJECT = frozenset({"torch", "numpy", "typing", "collections", "builtins"})
# Bases whose objects weights_only loads, or may (a tensor subclass, a typed dict).
_DATA_BASE = re.compile(r"Tensor|Parameter|TypedDict|\bdict\b|torch\.")
# Annotations of containers whose elements an annotation names (`dict[str, NDArray]`).
_CONTAINERS = frozenset({"dict", "Dict", "list", "List", "Mapping", "Sequence", "OrderedDict"})
# A file name worth matching across files: a stem of letters before the suffix
# (`model.pt`, `best_ckpt.pth`), not a bare suffix (`.pt`) or a number.
_NAMED_FILE = re.compile(r"[A-Za-z][\w\-.]*\.\w+")
# A shared constant naming a file: an upper-case name (`MODEL_FNAME`, `KEYS.MODEL`).
_CONSTANT = re.compile(r"[A-Z][A-Z0-9_]*")


@dataclass(frozen=True)
class Save:
    call: ast.Call
    scope: ast.AST  # the function (or module) the save is in
    path: str  # the text of the file argument
    path_node: ast.expr
    whole: str | None  # what non-tensor object the whole saved value is, if one
    keys: dict[str, str]  # dict key -> what non-tensor object its value is


def enclosing_class(tree: ast.Module, scope: ast.AST) -> ast.ClassDef | None:
    for node in walk_statements(tree):
        if isinstance(node, ast.ClassDef) and any(m is scope for m in node.body):
            return node
    return None


# -- file names ---------------------------------------------------------------
def file_keys(ctx: FileContext, scope: ast.AST, path: ast.expr, line: int) -> frozenset[str]:
    """Keys naming the file `path` (evaluated at `line` in `scope`) across files: the
    last part of the path, through the names the scope binds."""
    node: ast.expr = path
    for _ in range(8):
        if isinstance(node, ast.Name):
            bound = binding(ctx, scope, node.id, line) if scope is not ctx.tree else None
            if bound is None:
                break
            node = bound
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            node = node.right  # `root / name`
        elif isinstance(node, ast.JoinedStr) and node.values:
            node = node.values[-1]  # `f"{root}/{prefix}model.pt"`
        elif isinstance(node, ast.FormattedValue):
            if node.format_spec is not None or node.conversion != -1:
                return frozenset()
            node = node.value
        elif isinstance(node, ast.Call) and node.args:
            name = ctx.qualname(node.func) or ""
            if name in ("os.path.join", "posixpath.join") or name.endswith(".joinpath"):
                node = node.args[-1]
            elif name.rsplit(".", 1)[-1] in ("Path", "PurePath", "str", "fspath"):
                node = node.args[0]
            else:
                return frozenset()
        else:
            break
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        tail = node.value.replace("\\", "/").rsplit("/", 1)[-1].lstrip("_-.")
        return frozenset({f"lit:{tail}"}) if _NAMED_FILE.fullmatch(tail) else frozenset()
    if isinstance(node, ast.Name | ast.Attribute):
        text = ctx.segment(node)
        last = text.rsplit(".", 1)[-1]
        if not _CONSTANT.fullmatch(last) or text.startswith("self."):
            return frozenset()
        if isinstance(node, ast.Name):
            literal = _module_string(ctx.tree, node.id)
            if literal is not None:  # `MODEL_FILE = "model.pt"` at the top of this file
                return file_keys(ctx, ctx.tree, ast.Constant(literal), line)
        return frozenset({"const:" + ".".join(text.split(".")[-2:])})
    return frozenset()


def same_file(saved: ast.AST, loaded: ast.AST) -> bool:
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
            if len(a) != len(b) or not all(map(same_file, a, b)):
                return False
        elif isinstance(a, ast.AST) and isinstance(b, ast.AST):
            if not same_file(a, b):
                return False
        elif a != b:
            return False
    return True


def _template(text: ast.JoinedStr) -> re.Pattern[str]:
    """The names an f-string can give: its literal parts, anything for each field."""
    parts = [re.escape(str(v.value)) if isinstance(v, ast.Constant) else ".+" for v in text.values]
    return re.compile("".join(parts), re.DOTALL)


def _module_string(tree: ast.Module, name: str) -> str | None:
    for stmt in tree.body:
        if (
            isinstance(stmt, ast.Assign)
            and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
            and isinstance(stmt.value, ast.Constant)
            and isinstance(stmt.value.value, str)
        ):
            return stmt.value.value
    return None


def project_saves(ctx: FileContext) -> tuple[SavedFile, ...]:
    """The saves of the file to a file named by a key: the non-tensor object each
    writes, if one (none where the file registers safe globals: its loads may read
    them), and whether it writes CPU tensors only (`cpu_saves.saved_on_cpu`)."""
    reader = SavedObjects(ctx)
    safe = "safe_globals" in ctx.source
    found: list[SavedFile] = []
    for scope, call, path in file_saves(ctx):
        keys = file_keys(ctx, scope, path, call.lineno)
        if not keys:
            continue
        save = None if safe else reader.save(call, scope)
        what = save.whole if save is not None and save.whole is not None else ""
        cpu = saved_on_cpu(ctx, scope, call)
        found.extend(SavedFile(key, ctx.path, call.lineno, what, cpu) for key in keys)
    return tuple(found)


# -- saved values -------------------------------------------------------------
class SavedObjects:
    """What non-tensor objects the values a file saves hold."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx

    def save(self, call: ast.Call, scope: ast.AST) -> Save | None:
        obj = call.args[0] if call.args else keyword(call, "obj")
        path = save_path(call)
        if obj is None or path is None:
            return None
        if isinstance(obj, ast.Name):
            bound = binding(self.ctx, scope, obj.id, call.lineno)
            if isinstance(bound, ast.Dict):
                obj = bound
        keys: dict[str, str] = {}
        whole = None
        if isinstance(obj, ast.Dict):
            for key, value in zip(obj.keys, obj.values, strict=True):
                what = self.object(value, scope, call.lineno)
                if isinstance(key, ast.Constant) and isinstance(key.value, str) and what:
                    keys[key.value] = what
                whole = whole or what
        else:
            whole = self.object(obj, scope, call.lineno)
        if whole is None:
            return None
        return Save(call, scope, self.ctx.segment(path), path, whole, keys)

    def object(self, value: ast.expr, scope: ast.AST, line: int, depth: int = 2) -> str | None:
        """What non-tensor object `value` is ("an `argparse.Namespace`", ...), if known."""
        if depth < 0:
            return None
        ctx = self.ctx
        if isinstance(value, ast.Call):
            name = ctx.qualname(value.func) or ""
            if name.startswith("numpy.") and name.rsplit(".", 1)[-1][:1].islower():
                return f"a NumPy array (`{ctx.segment(value.func)}(...)`)"
            if isinstance(value.func, ast.Attribute):
                if value.func.attr in ("numpy", "to_numpy"):
                    return f"a NumPy array (`.{value.func.attr}()`)"
                if value.func.attr == "parse_args":
                    return "an `argparse.Namespace`"
                if value.func.attr in _MODULE_METHODS:
                    return self.object(value.func.value, scope, line, depth)
            if self.is_class_of_file(name):
                return f"a `{name}` object"
            return self._returned_array(value, name)
        if isinstance(value, ast.Name):
            if value.id == "self":
                cls = enclosing_class(ctx.tree, scope)
                if cls is not None:
                    return f"a `{cls.name}` object (`self`)"
                return None
            declared = self._declared_class(value.id, scope, line)
            if declared is not None:
                return declared
            bound = binding(ctx, scope, value.id, line)
            if bound is not None:
                return self.object(bound, scope, line, depth - 1)
            generic = self._type_argument(value.id, scope)
            if generic is not None:
                return generic
            params = getattr(scope, "args", None)
            arg = next((a for a in params.args if a.arg == value.id), None) if params else None
            if arg is not None and arg.annotation is not None and holds_array(ctx, arg.annotation):
                return f"a NumPy array (`{value.id}: {ctx.segment(arg.annotation)}`)"
            if scope is not ctx.tree and _MODEL_NAME.fullmatch(value.id):
                params = getattr(scope, "args", None)
                if params is not None and any(a.arg == value.id for a in params.args):
                    return f"a whole model (`{value.id}`)"
            return None
        if (
            isinstance(value, ast.Attribute)
            and isinstance(value.value, ast.Name)
            and value.value.id == "self"
        ):
            cls = enclosing_class(ctx.tree, scope)
            return self._attribute_object(cls, value.attr) if cls is not None else None
        return None

    def _returned_array(self, call: ast.Call, name: str) -> str | None:
        """A call of a project function whose return annotation is a NumPy array, or a
        union or container of them (`-> npt.NDArray | dict[str, npt.NDArray]`)."""
        if not name or not isinstance(call.func, ast.Name | ast.Attribute):
            return None
        definer: FileContext | None = self.ctx
        if isinstance(call.func, ast.Name) and call.func.id not in self.ctx.imports:
            returned = _module_function_returns(self.ctx.tree, name)
        elif isinstance(call.func, ast.Name) and "." in name:
            # imported from a file of the project (`from pkg.io import read_names`)
            module, function = name.rsplit(".", 1)
            found = sibling_file(self.ctx, module, by_tail=True)
            definer = found.ctx if found is not None else None
            returned = _module_function_returns(definer.tree, function) if definer else None
        else:
            return None
        if definer is None or returned is None or not holds_array(definer, returned):
            return None
        return (
            f"a NumPy array (`{self.ctx.segment(call.func)}(...)` returns "
            f"`{definer.segment(returned)}`)"
        )

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
        if target is None and not self.is_class_of_file(cls):
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
        cls = enclosing_class(self.ctx.tree, scope)
        if cls is None or not any(
            isinstance(base, ast.Subscript)
            and any(isinstance(n, ast.Name) and n.id == var for n in walk(base.slice))
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

    def is_class_of_file(self, name: str) -> bool:
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
        for node in walk_statements(init):
            if not isinstance(node, ast.Assign) or not any(
                isinstance(t, ast.Attribute)
                and isinstance(t.value, ast.Name)
                and t.value.id == "self"
                and t.attr == attr
                for t in node.targets
            ):
                continue
            value = node.value
            if isinstance(value, ast.Call) and self.is_class_of_file(
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
        if self.is_class_of_file(annotation):
            return True
        target = self.ctx.imports.get(annotation)
        if target is None:
            return False
        package = target.split(".", 1)[0]
        return package != "" and package in re.split(r"[\\/]", self.ctx.path)[:-1]


def _module_function_returns(tree: ast.Module, name: str) -> ast.expr | None:
    """The return annotation of the module-level function `name` (the last definition)."""
    found = None
    for stmt in tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name == name:
            found = stmt.returns
    return found


def holds_array(ctx: FileContext, annotation: ast.expr) -> bool:
    """The annotation says the value is a NumPy array, or holds one on every branch
    (`NDArray | dict[str, NDArray]`); `Optional[...]` may be None: no."""
    if isinstance(annotation, ast.Constant) and isinstance(annotation.value, str):
        try:
            annotation = ast.parse(annotation.value, mode="eval").body
        except SyntaxError:
            return False
    if isinstance(annotation, ast.BinOp) and isinstance(annotation.op, ast.BitOr):
        return holds_array(ctx, annotation.left) and holds_array(ctx, annotation.right)
    if isinstance(annotation, ast.Subscript):
        outer = ctx.qualname(annotation.value) or ""
        last = outer.rsplit(".", 1)[-1]
        items = (
            list(annotation.slice.elts)
            if isinstance(annotation.slice, ast.Tuple)
            else [annotation.slice]
        )
        if last == "Union":
            return all(holds_array(ctx, item) for item in items)
        if last in ("tuple", "Tuple"):  # each of its items (`tuple[dict, NDArray]`)
            return any(holds_array(ctx, item) for item in items)
        if last in _CONTAINERS:  # the values of a dict, the items of a list
            return holds_array(ctx, items[-1])
        return _is_array(outer)
    return _is_array(ctx.qualname(annotation) or "")


def _is_array(name: str) -> bool:
    return name.startswith("numpy") and name.rsplit(".", 1)[-1] in ("ndarray", "NDArray")


def _is_type_var(tree: ast.Module, name: str, qualname: Callable[[ast.expr], str | None]) -> bool:
    """`name = TypeVar("name")` at module level."""
    return any(
        isinstance(stmt, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == name for t in stmt.targets)
        and isinstance(stmt.value, ast.Call)
        and (qualname(stmt.value.func) or "").rsplit(".", 1)[-1] == "TypeVar"
        for stmt in tree.body
    )
