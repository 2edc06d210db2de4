"""The functions and classes of one file, and where names are used in it."""

from __future__ import annotations

import ast
import bisect
import itertools
from collections.abc import Iterable
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.name_uses import NameUses
from torchdoctor.check.analysis.syntax import (
    _DEF_OR_IMPORT,
    _is_static,
    _target_names,
    attribute_uses,
    module_receivers,
)
from torchdoctor.check.analysis.torch_api import _NON_MODULE_NN, LIBRARY_MODULE_BASES
from torchdoctor.check.analysis.values import AnyFunction, ScopeNode, Value
from torchdoctor.check.analysis.wrapped import wrapped_functions
from torchdoctor.check.context import FileContext
from torchdoctor.check.lines import line_end, line_start
from torchdoctor.check.project import KNOWN_MODULE_BASES
from torchdoctor.check.tree_walk import Definition, child_statements, definitions

if TYPE_CHECKING:
    from torchdoctor.check.project import ProjectIndex


class FileIndex:
    """Index of a file's functions and classes, and the cache of their scope facts."""

    MAX_SEED_DEPTH = 2

    TEXT_SCANS = 32  # names looked up in the text before one tree walk indexes them all

    # A caller that mentions none of these cannot pass a moved module, a device tensor
    # or a loader: it is not analysed, and the callee gets no seeds (unknown is quiet).
    FACT_WORDS = (".to(", ".cuda(", "device", "DataLoader", "loader", "Loader")

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.project: ProjectIndex = ctx.project
        self._functions: list[AnyFunction] = []
        self._class_of: dict[AnyFunction, ast.ClassDef] = {}
        self.classes: dict[str, ast.ClassDef] = {}  # top-level classes by name
        self.toplevel_functions: dict[str, AnyFunction] = {}
        self._methods: dict[ast.ClassDef, dict[str, AnyFunction]] = {}
        self._index(ctx.shared("tree_walk.definitions", lambda c: definitions(c.tree.body)))
        # `_load_cached = cachetools.cached(cache)(_load)`: a call of the name runs `_load`;
        # through a cache, the object returned may be one an earlier caller changed
        self.cached_results: frozenset[str] = frozenset()
        wrapped = wrapped_functions(ctx)
        if wrapped:
            for name, w in wrapped.items():
                self.toplevel_functions.setdefault(name, self.toplevel_functions[w.function])
            self.cached_results = frozenset(n for n, w in wrapped.items() if w.cached)
        self._function_lines = [f.lineno for f in self._functions]
        self._reach = list(  # the furthest line any function up to this one spans
            itertools.accumulate((f.end_lineno or f.lineno for f in self._functions), max)
        )
        self._innermost: dict[int, ScopeNode] = {}
        self._in_progress: set[ast.AST] = set()
        self._module_classes: dict[ast.ClassDef, bool] = {}
        self._self_attrs_assigned: dict[AnyFunction, frozenset[str]] = {}
        self._texts: dict[ast.AST, str] = {}
        self._uses: dict[str, list[tuple[int, bool]] | None] = {}
        self._uses_indexed = False
        self._tree: dict[str, list[tuple[int, bool]] | None] = {}  # _tree_uses
        self._name_uses = NameUses(ctx)
        self._many_known = False
        self._returns: dict[AnyFunction, Value] = {}
        self._makes_factory: dict[AnyFunction, bool] = {}
        self._module_code_text: str | None = None
        self._module_names: frozenset[str] | None = None
        self._project_classes: dict[str, str | None] = {}  # name -> its file (project_class)
        self._star: bool | None = None  # the file has a star import
        self._class_uses: dict[ast.ClassDef, dict[str, tuple[int, int, list[AnyFunction]]]] = {}
        self._module_attrs: dict[ast.ClassDef, frozenset[str]] = {}
        self._init_helpers: dict[ast.ClassDef, frozenset[str]] = {}
        self._none_attrs: dict[ast.ClassDef, frozenset[str]] = {}  # FileFlow.none_attributes
        # FlowSeeds._first_call_holds: (class, attribute) -> what its writers do
        self._first_call: dict[tuple[ast.ClassDef, str], bool | tuple[AnyFunction, ...]] = {}
        self._first_call_busy: set[tuple[ast.ClassDef, str]] = set()
        self._inherited: dict[ast.ClassDef, dict[str, AnyFunction]] = {}
        self._reached_from: dict[
            tuple[ast.ClassDef, AnyFunction], dict[AnyFunction, AnyFunction | None]
        ] = {}

    # -- index -------------------------------------------------------------------------
    def _index(self, found: list[tuple[Definition, Definition | None]]) -> None:
        """Functions, methods (directly in a class body, or under its `if`s) and the
        classes, from `tree_walk.definitions`."""
        for node, owner in found:
            if node.__class__ is ast.ClassDef:
                assert isinstance(node, ast.ClassDef)
                if owner is None:
                    self.classes[node.name] = node
                self._methods.setdefault(node, {})
                continue
            assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            self._functions.append(node)
            if isinstance(owner, ast.ClassDef):
                self._class_of[node] = owner
                self._methods.setdefault(owner, {})[node.name] = node
            elif owner is None:
                self.toplevel_functions[node.name] = node

    def release(self) -> None:
        """Drop the cached facts (they reference the syntax tree)."""
        self._texts.clear()
        self._class_uses.clear()
        self._self_attrs_assigned.clear()
        self._module_attrs.clear()
        self._init_helpers.clear()
        self._none_attrs.clear()
        self._first_call.clear()
        self._inherited.clear()
        self._reached_from.clear()
        self._name_uses.release()

    def functions(self) -> list[AnyFunction]:
        """Every function and method of the file, in source order of their headers."""
        return self._functions

    def every_class(self) -> list[ast.ClassDef]:
        """Every class of the file, nested ones too, in source order of their headers."""
        return list(self._methods)

    def class_of(self, func: AnyFunction) -> ast.ClassDef | None:
        """The class `func` is a method of (directly in its body), or None."""
        return self._class_of.get(func)

    def methods(self, cls: ast.ClassDef) -> dict[str, AnyFunction]:
        return self._methods.get(cls, {})

    def inherited_methods(self, cls: ast.ClassDef) -> dict[str, AnyFunction]:
        """The methods an instance of `cls` runs: its own, then those of its base classes
        defined at the top of this file (first base first), not overridden."""
        cached = self._inherited.get(cls)
        if cached is not None:
            return cached
        found: dict[str, AnyFunction] = {}
        seen: set[ast.ClassDef] = set()
        todo = [cls]
        while todo:
            current = todo.pop(0)
            if current in seen:
                continue
            seen.add(current)
            for name, method in self.methods(current).items():
                found.setdefault(name, method)
            for base in current.bases:
                local = self.classes.get(base.id) if isinstance(base, ast.Name) else None
                if local is not None:
                    todo.append(local)
        self._inherited[cls] = found
        return found

    def module_attrs(self, cls: ast.ClassDef) -> frozenset[str]:
        """Attributes `x` some method of `cls` uses as an nn.Module (`self.x.eval()`)."""
        found = self._module_attrs.get(cls)
        if found is None:
            names: set[str] = set()
            for method in self.methods(cls).values():
                params = [*method.args.posonlyargs, *method.args.args]
                if not params:
                    continue
                prefix = params[0].arg + "."
                for key in module_receivers(method, self.ctx):
                    if key.startswith(prefix):
                        names.add(key[len(prefix) :].split(".", 1)[0])
            found = frozenset(names)
            self._module_attrs[cls] = found
        return found

    def is_module_class(self, cls: ast.ClassDef) -> bool:
        """Whether `cls` subclasses nn.Module, judged by its own bases.

        Stricter than the project index: a class of the same name elsewhere in the
        project does not make a base-less `class MyModule:` a module.
        """
        known = self._module_classes.get(cls)
        if known is None:
            self._module_classes[cls] = False  # guards against cyclic bases
            known = any(self._is_module_base(base) for base in cls.bases)
            self._module_classes[cls] = known
        return known

    def _is_module_base(self, base: ast.expr) -> bool:
        if isinstance(base, ast.Subscript):
            base = base.value  # Generic[...] style bases
        qual = self.ctx.qualname(base)
        return qual is not None and self.is_module_class_name(qual)

    def is_module_class_name(self, qual: str) -> bool:
        """Whether a class name, resolved through this file's imports, is an nn.Module."""
        last = qual.rsplit(".", 1)[-1]
        if not last[:1].isupper() or last in _NON_MODULE_NN:
            return False
        if qual.startswith("torch."):
            return qual.startswith("torch.nn.") and "functional" not in qual
        local = self.classes.get(qual)
        if local is not None:
            return self.is_module_class(local)
        if last in KNOWN_MODULE_BASES or qual in LIBRARY_MODULE_BASES:
            return True
        if qual.startswith(("numpy.", "np.", "tensorflow.", "keras.", "jax.", "flax.")):
            return False
        return last in self.project.module_classes

    def is_forward(self, func: AnyFunction) -> bool:
        """`forward` of an nn.Module subclass."""
        cls = self.class_of(func)
        return func.name == "forward" and cls is not None and self.is_module_class(cls)

    def init_helpers(self, cls: ast.ClassDef) -> frozenset[str]:
        """Methods that only `__init__` runs (directly or through one another), by
        `self.m(...)` calls and never as a value: what they set on `self` is set at
        construction, like `__init__`'s own `self.x = ...` (`self._build_masks()`)."""
        found = self._init_helpers.get(cls)
        if found is None:
            methods = self.methods(cls)
            uses = self._method_uses(cls)
            helpers: set[str] = set()
            changed = "__init__" in methods
            while changed:
                changed = False
                for name, method in methods.items():
                    if name == "__init__" or name in helpers or _is_static(method):
                        continue
                    used, calls, callers = uses.get(name, (0, 0, []))
                    if (
                        calls
                        and used == calls
                        and all(c.name == "__init__" or c.name in helpers for c in callers)
                    ):
                        helpers.add(name)
                        changed = True
            found = self._init_helpers[cls] = frozenset(helpers)
        return found

    def reached_methods(self, cls: ast.ClassDef, start: AnyFunction) -> list[AnyFunction]:
        """The methods of `cls` that `start` runs through `self.m(...)` calls, one inside
        another (`forward` -> `_masks` -> `_one_mask`), `start` first."""
        return list(self._reached(cls, start))

    def reaches(self, cls: ast.ClassDef, start: AnyFunction, method: AnyFunction) -> bool:
        """`method in reached_methods(cls, start)`, without the copy."""
        return method in self._reached(cls, start)

    def call_chain(
        self, cls: ast.ClassDef, start: AnyFunction, target: AnyFunction
    ) -> list[AnyFunction]:
        """The methods from `start` to `target` through `self.m(...)` calls, both ends
        included (a shortest chain; empty if `start` does not reach `target`)."""
        parents = self._reached(cls, start)
        if target not in parents:
            return []
        chain = [target]
        while (parent := parents[chain[-1]]) is not None:
            chain.append(parent)
        return chain[::-1]

    def _reached(
        self, cls: ast.ClassDef, start: AnyFunction
    ) -> dict[AnyFunction, AnyFunction | None]:
        """Each method `start` reaches, with the method that calls it on a shortest chain."""
        cached = self._reached_from.get((cls, start))
        if cached is not None:
            return cached
        methods = self.inherited_methods(cls)
        called: dict[AnyFunction, list[AnyFunction]] = {}
        for name, (_, calls, callers) in self._method_uses(cls).items():
            method = methods.get(name)
            if method is not None and calls:
                for caller in callers:
                    called.setdefault(caller, []).append(method)
        parents: dict[AnyFunction, AnyFunction | None] = {start: None}
        todo = [start]
        while todo:
            current = todo.pop(0)
            for method in called.get(current, []):
                if method not in parents:
                    parents[method] = current
                    todo.append(method)
        self._reached_from[(cls, start)] = parents
        return parents

    def text(self, node: ast.AST) -> str:
        """The source lines of a statement-level node (cached; for cheap text gates)."""
        found = self._texts.get(node)
        if found is None:
            if isinstance(node, ast.Module):
                found = self.ctx.source
            else:
                first = getattr(node, "lineno", 1)
                last = getattr(node, "end_lineno", None) or first
                start = self.ctx.offset(first, 0)
                end = self.ctx.offset(last + 1, 0) if last < len(self.ctx.lines) else None
                found = self.ctx.source[start:end]
            self._texts[node] = found
        return found

    def module_code_text(self) -> str:
        """The text of the module-level code the module scope runs: the top-level
        statements, with only the decorator lines of functions and classes."""
        if self._module_code_text is None:
            parts: list[str] = []
            for stmt in self.ctx.tree.body:
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    parts.extend(self.ctx.segment(dec) for dec in stmt.decorator_list)
                else:
                    parts.append(self.text(stmt))
            self._module_code_text = "\n".join(parts)
        return self._module_code_text

    def mentions(self, node: ast.AST, *needles: str) -> bool:
        """Whether the source text of `node` contains any of `needles`."""
        text = self.text(node)
        for needle in needles:  # noqa: SIM110 (a loop, not any(generator): ~40,000 calls a run)
            if needle in text:
                return True
        return False

    def project_class(self, name: str) -> str | None:
        """The file of another project file's plain class that `name` means here: bound
        by `from agents import RNDAgent` (that module's file) or only by a star import
        (`from agents import *`, the name bound nowhere in this file), and defined in
        that one file of the project. None: not known to be one."""
        if not name[:1].isupper() or name in self.classes:
            return None
        if name not in self._project_classes:
            self._project_classes[name] = self._project_class(name)
        return self._project_classes[name]

    def _project_class(self, name: str) -> str | None:
        qual = self.ctx.imports.get(name)
        if qual is not None:
            module, _, last = qual.lstrip(".").rpartition(".")
            tail = "/" + module.replace(".", "/")
        elif self._star_import() and not self.module_assigns(name):
            last, tail = name, ""
        else:
            return None
        paths = self.project.class_files.get(last, ())
        if len(paths) != 1 or last in self.project.module_classes:
            return None
        path = "/" + paths[0].replace("\\", "/")
        if tail and not (path.endswith(tail + ".py") or path.endswith(tail + "/__init__.py")):
            return None
        return paths[0]

    def _star_import(self) -> bool:
        if self._star is None:
            self._star = "import *" in self.ctx.source
        return self._star

    def module_assigns(self, name: str) -> bool:
        """Whether module-level code assigns `name` (imports and defs do not count).

        Lets functions skip analysing the module for globals that cannot hold a fact.
        """
        if self._module_names is None:
            names: set[str] = set()
            todo: list[ast.stmt] = list(self.ctx.tree.body)
            while todo:
                stmt = todo.pop()
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    continue
                if isinstance(stmt, ast.Import | ast.ImportFrom):
                    continue
                for field in ("targets", "target", "items"):
                    value = getattr(stmt, field, None)
                    for node in value if isinstance(value, list) else [value]:
                        if isinstance(node, ast.withitem):
                            node = node.optional_vars
                        if isinstance(node, ast.AST):
                            names.update(_target_names(node))  # type: ignore[arg-type]
                todo.extend(child_statements(stmt))
            self._module_names = frozenset(names)
        return name in self._module_names

    def scopes_at(self, lines: Iterable[int]) -> list[ScopeNode]:
        """The innermost scope of each line, without repeats, in first-seen order."""
        return list(dict.fromkeys(self.innermost_scope(line) for line in lines))

    def innermost_scope(self, line: int) -> ScopeNode:
        """The innermost function whose text holds `line` (else the module)."""
        found = self._innermost.get(line)
        if found is None:
            found = self.ctx.tree
            # functions are listed in source order, nested ones after their parent: the
            # last one starting at or before `line` that still spans it is innermost;
            # the scan stops where no earlier function reaches `line` (a running maximum)
            index = bisect.bisect_right(self._function_lines, line) - 1
            while index >= 0 and self._reach[index] >= line:
                func = self._functions[index]
                if (func.end_lineno or func.lineno) >= line:
                    found = func
                    break
                index -= 1
            self._innermost[line] = found
        return found

    def _occurrences(self, name: str) -> list[tuple[int, bool]] | None:
        """(line, is a call) of each use of the top-level function or class `name`.

        None when `name` is also used as a value (a callback, a decorator, a base
        class): then its calls cannot all be seen. The first few names are found in
        the text; after that (or once a name is used as a value) from the syntax tree,
        each name on the lines naming it (`_tree_uses`). A name the tree shows no use
        of keeps what the text said, and is read in the text while fewer than
        TEXT_SCANS names are known to be used (`_few_known`).
        """
        if not self._uses_indexed:
            if name in self._uses:
                return self._uses[name]
            if len(self._uses) < self.TEXT_SCANS:
                uses = self._scan_uses(name)
                if uses is not None:
                    self._uses[name] = uses
                    return uses
                self._uses_indexed = True
                self._uses[name] = self._tree_uses(name)  # (kept: it counts as known)
                return self._uses[name]
            self._uses_indexed = True
        found = self._tree_uses(name)
        if found is None or found:
            return found
        if name in self._uses:
            return self._uses[name]
        if not self._few_known():
            return []
        uses = self._scan_uses(name)
        self._uses[name] = uses or []
        return self._uses[name]

    def _tree_uses(self, name: str) -> list[tuple[int, bool]] | None:
        if name not in self._tree:
            known = name in self.toplevel_functions or name in self.classes
            self._tree[name] = self._name_uses.uses(name) if known else []
        return self._tree[name]

    def _few_known(self) -> bool:
        """Whether fewer than TEXT_SCANS names were read in the text or have a use in
        the tree (the names one walk of the whole tree would have listed)."""
        if self._many_known:
            return False
        known = len(self._uses)
        for name in self.toplevel_functions.keys() | self.classes.keys():
            if name not in self._uses:
                found = self._tree_uses(name)
                known += found is None or bool(found)
            if known >= self.TEXT_SCANS:
                self._many_known = True  # (names are only added)
                return False
        return True

    def _scan_uses(self, name: str) -> list[tuple[int, bool]] | None:
        """`name(` is a call; `name` followed by `,` `)` `]` `}` or a line end is a value
        (then None: the syntax tree tells); prose in a docstring (`name the ...`) is
        neither."""
        source = self.ctx.source
        uses: list[tuple[int, bool]] = []
        start = source.find(name)
        while start >= 0:
            end = start + len(name)
            before = source[start - 1] if start else " "
            after = source[end : end + 1]
            if not (before.isalnum() or before in "_.\"'") and not (
                after.isalnum() or after == "_"
            ):
                rest = source[end : line_end(source, end) + 1].lstrip(" \t")
                head = source[line_start(source, start) : start]
                if _DEF_OR_IMPORT.fullmatch(head):
                    pass  # `def name(`, `class name(`, `import name`: not a use
                elif rest.startswith("(") and not head.rstrip().endswith("@"):
                    uses.append((self.ctx.line_of_offset(start), True))
                elif (not rest or rest[0] in ",)]}\r\n" or head.rstrip().endswith("@")) and not (
                    _DEF_OR_IMPORT.fullmatch(head)
                ):
                    # a value, or prose in a comment or docstring (`# train, test, and
                    # DataLoader`): the syntax tree tells
                    return None
            start = source.find(name, end)
        return uses

    def _method_uses(self, cls: ast.ClassDef) -> dict[str, tuple[int, int, list[AnyFunction]]]:
        """Per method name `m`: (uses of `self.m`, calls `self.m(`, the methods calling it),
        inherited methods included (a base's `forward` calls the subclass's `self.m(...)`)."""
        found = self._class_uses.get(cls)
        if found is None:
            found = {}
            for method in self.inherited_methods(cls).values():
                params = [*method.args.posonlyargs, *method.args.args]
                me = params[0].arg if params else "self"
                for match in attribute_uses(self.text(method), me):
                    uses, calls, callers = found.get(match.group(2), (0, 0, []))
                    if match.group(3):
                        calls += 1
                        if not callers or callers[-1] is not method:
                            callers = [*callers, method]
                    found[match.group(2)] = (uses + 1, calls, callers)
            self._class_uses[cls] = found
        return found
