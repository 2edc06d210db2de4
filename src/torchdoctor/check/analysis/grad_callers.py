"""Whether every call of a function in the project runs with gradients off (TD202).

`LM.evaluate` runs a model with gradients on in its own file, but the project calls it
only through `calculate_lm_score` <- `Decoder.beam_search` <- `Transformer.evaluate`
<- `model.evaluate(...)` inside `with torch.no_grad():` of another file: it never
records a graph. The question is asked rarely (only where TD202 would report), so the
project-wide part is built on the first ask and kept for the run (`ProjectIndex.disk`):
each file's text read once, a file's calls summarized once (parsed only when its text
names a function asked about), the import graph resolved only as far as asked. Limits
are per question, so the answer does not depend on the order files are checked in.

Calls are matched by name, over-approximately: every `x.m(...)` of the files that may
share a program with the definition (a script importing both, directly or not) may
call the method `m`, whatever `x` is; a bare `f(...)` or `x.f(...)` may call the
function `f`. A function is covered when it has such a call, and every one sits under
`no_grad` / `inference_mode` (a `with`, a decorator), or in a function that is covered
itself (to a small depth; a cycle adds no entry). Anything else is unknown: a use of the
name as a value or a string (`getattr`, a callback; not an attribute of parsed
command-line options, `args.evaluate`), module-level code, a nested
function or lambda, a generator, a decorated function, a dunder or a method the base
class (nn.Module, or a class from outside the project) may call, a file of a
distributed package (its users call it).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field

from torchdoctor.check.analysis.grad_contexts import is_no_grad_decorated, with_item_context
from torchdoctor.check.analysis.library_package import package_of
from torchdoctor.check.analysis.module_paths import record_dependency
from torchdoctor.check.analysis.names import FuncNode
from torchdoctor.check.context import FileContext
from torchdoctor.check.project import ProjectIndex
from torchdoctor.check.source_text import decode_source

_MAX_DEPTH = 5  # callers of callers ... of the function asked about
_MAX_NAMES = 24  # functions resolved for one question
_MAX_FILES = 80  # files naming them read for one question (beyond: unknown)
_MAX_ABOVE = 200  # importers, direct or not, of one file (beyond: unknown)
_MAX_PROJECT_FILES = 2000  # a larger project is not followed (the report stays)
_MAX_IMPORTERS = 100  # files whose import lines name one file (beyond: unknown)
# Methods nn.Module's own code calls (a subclass's override runs from there).
_MODULE_CALLED_NAMES = (
    "forward extra_repr train eval state_dict load_state_dict apply to cuda cpu type float "
    "double half bfloat16 zero_grad parameters named_parameters buffers named_buffers "
    "children named_children modules named_modules requires_grad_ get_extra_state "
    "set_extra_state"
)
_MODULE_CALLED = frozenset(_MODULE_CALLED_NAMES.split())
_PLAIN_BASES = frozenset({"object", "ABC", "abc.ABC", "Generic"})
_MODULE_BASES = frozenset({"nn.Module", "torch.nn.Module", "Module"})
_ALLOWED_DECORATORS = frozenset({"staticmethod", "classmethod"})

# A function: (name, "function" | "method", the file defining it).
Key = tuple[str, str, str]


@dataclass(frozen=True)
class _Site:
    """One call of a name: the function it sits in (None: module level, a nested
    function, a lambda: callers unknown) and whether gradients are off there."""

    owner: Key | None
    no_grad: bool
    attribute: bool  # `x.name(...)`, not `name(...)`


@dataclass
class _Summary:
    """What one file calls, where, and what it imports."""

    sites: dict[str, list[_Site]] = field(default_factory=dict)
    # names used other than called: bare (`fn = evaluate`), attributes by the last name
    # of their receiver ("" if none: `fn = lm.evaluate` -> {"evaluate": {"lm"}}), and
    # strings (`getattr(lm, "evaluate")`); only the last two can name a method
    names: set[str] = field(default_factory=set)
    attributes: dict[str, set[str]] = field(default_factory=dict)
    strings: set[str] = field(default_factory=set)
    imports: list[str] = field(default_factory=list)  # module names it may import
    hidden: set[tuple[str, str]] = field(default_factory=set)  # (name, kind): callers unseen


class _Index:
    """The project's calls, summarized on demand; one per run."""

    def __init__(self, project: ProjectIndex) -> None:
        self.project = project
        self.paths = sorted(project.paths)
        self.texts: dict[str, str | None] = {}
        self.summaries: dict[str, _Summary | None] = {}
        self.importers: dict[str, frozenset[str] | None] = {}
        self.naming: dict[str, list[str] | None] = {}
        self.by_stem: dict[str, list[str]] | None = None
        self.upward: dict[str, frozenset[str] | None] = {}
        self.answers: dict[Key, bool] = {}

    def text(self, path: str) -> str | None:
        if path not in self.texts:
            text = None
            try:
                with open(path, "rb") as handle:
                    text = decode_source(handle.read())
            except (OSError, UnicodeDecodeError, LookupError):
                text = None
            self.texts[path] = text
        return self.texts[path]

    def summary(self, path: str) -> _Summary | None:
        if path not in self.summaries:
            text = self.text(path)
            found = None
            if text is not None:
                try:
                    tree = ast.parse(text)
                except (SyntaxError, ValueError, MemoryError, RecursionError):
                    tree = None
                if tree is not None:
                    ctx = FileContext(path, text, tree, self.project)
                    try:
                        found = _summarize(ctx)
                    except RecursionError:
                        found = None
                    finally:
                        ctx.close()
            self.summaries[path] = found
        return self.summaries[path]

    def files_naming(self, word: str) -> list[str] | None:
        """The files whose text holds `word` (None: one could not be read)."""
        if word not in self.naming:
            found: list[str] = []
            for path in self.paths:
                text = self.text(path)
                if text is None:
                    self.naming[word] = None
                    return None
                if word in text:
                    found.append(path)
            self.naming[word] = found
        return self.naming[word]

    def imported_by(self, path: str) -> frozenset[str] | None:
        """The files that import `path` (None: one could not be read)."""
        if path not in self.importers:
            folder, _, name = path.rpartition("/")
            package = name == "__init__.py"
            stem = folder.rpartition("/")[2] if package else name[:-3]
            self.importers[path] = self._importers(path, folder, stem, package)
        return self.importers[path]

    def _importers(self, path: str, folder: str, stem: str, package: bool) -> frozenset[str] | None:
        names = re.compile(rf"^[ \t]*(?:from|import)[ \t][^\n]*\b{re.escape(stem)}\b", re.M)
        candidates = []
        for other in self.paths:
            text = self.text(other)
            if text is None:
                return None
            # (`from . import x` in the package imports its __init__ unnamed)
            relative = package and "from ." in text and other.startswith(folder + "/")
            if other == path or not (stem in text or relative):
                continue
            # an import line naming it, or one that may continue on the next lines
            if relative or names.search(text) or "import (" in text or "\\\n" in text:
                candidates.append(other)
        if len(candidates) > _MAX_IMPORTERS:
            return None  # a module every file imports: too many programs to follow
        found = set()
        for other in candidates:
            summary = self.summary(other)
            if summary is None:
                return None
            if any(path in self.resolve(other, m) for m in summary.imports):
                found.add(other)
        return frozenset(found)

    def above(self, path: str) -> frozenset[str] | None:
        """`path` and every file importing it, directly or not (None: unknown)."""
        if path not in self.upward:
            seen = {path}
            todo = [path]
            result: frozenset[str] | None = None
            while len(seen) <= _MAX_ABOVE:
                if not todo:
                    result = frozenset(seen)
                    break
                importers = self.imported_by(todo.pop())
                if importers is None:
                    break  # unknown
                todo.extend(importers - seen)
                seen |= importers
            self.upward[path] = result
        return self.upward[path]

    def resolve(self, importer: str, module: str) -> set[str]:
        """The project files `module` (absolute or relative) may name from `importer`."""
        level = len(module) - len(module.lstrip("."))
        parts = [p for p in module.lstrip(".").split(".") if p]
        folder = importer.split("/")[:-1]
        if level:
            bases = [folder[: len(folder) - (level - 1)]]
        else:
            bases = [folder[:i] for i in range(len(folder), -1, -1)]
        found = set()
        paths = self.project.paths
        for base in bases:
            stem = "/".join(base + parts)
            for candidate in (f"{stem}.py", f"{stem}/__init__.py" if stem else "__init__.py"):
                if candidate in paths:
                    found.add(candidate)
        if not found and not level and parts:  # installed from elsewhere: by its tail
            if self.by_stem is None:
                self.by_stem = {}
                for p in self.paths:
                    parent, _, name = p.rpartition("/")
                    key = parent.rpartition("/")[2] if name == "__init__.py" else name[:-3]
                    self.by_stem.setdefault(key, []).append(p)
            tail = "/".join(parts)
            ends = (f"/{tail}.py", f"/{tail}/__init__.py")
            found = {p for p in self.by_stem.get(parts[-1], ()) if f"/{p}".endswith(ends)}
        return found


def _index(project: ProjectIndex) -> _Index:
    found = project.disk.get("grad_callers")
    if not isinstance(found, _Index):
        found = project.disk["grad_callers"] = _Index(project)
    return found


def called_only_without_grad(ctx: FileContext, node: FuncNode, cls: ast.ClassDef | None) -> bool:
    """Whether every call of the function `node` (a method of `cls`, or a module-level
    function) in the project runs with gradients off."""
    project = ctx.project
    path = ctx.path.replace("\\", "/")
    if not project.turns_grad_off or len(project.paths) > _MAX_PROJECT_FILES:
        return False
    if path not in project.paths:
        return False
    index = _index(project)
    key: Key = (node.name, "method" if cls is not None else "function", path)
    if key not in index.answers:
        # (a budget per question, not per run: the answer must not depend on the order
        # files are checked in, nor on how they are shared among worker processes)
        index.answers[key] = _covered(index, key, 0, set(), _Budget())
    for read in index.texts:  # the answer depends on every file read (a call may appear)
        record_dependency(read)
    return index.answers[key]


@dataclass
class _Budget:
    names: int = _MAX_NAMES
    files: set[str] = field(default_factory=set)


def _covered(index: _Index, key: Key, depth: int, visiting: set[Key], budget: _Budget) -> bool:
    if key in visiting:
        return True  # a cycle: its entries from outside are checked on their own
    name, kind, path = key
    budget.names -= 1
    if depth > _MAX_DEPTH or budget.names < 0 or name.startswith("__"):
        return False
    if kind == "method" and name in _MODULE_CALLED:
        return False
    if package_of(path, index.project.disk) is not None:
        return False  # a distributed package: its users call it too
    own = index.summary(path)
    if own is None or (name, kind) in own.hidden:
        return False
    mine = index.above(path)
    if mine is None:
        return False
    visiting.add(key)
    try:
        calls = 0
        naming = index.files_naming(name)
        if naming is None:
            return False
        for other in naming:
            budget.files.add(other)
            if len(budget.files) > _MAX_FILES:
                return False
            summary = index.summary(other)
            if summary is None:
                return False
            referenced = _referenced(index, summary, name, kind)
            if not referenced and name not in summary.sites:
                continue  # the word in a comment, or a longer name
            theirs = index.above(other)
            if theirs is None:
                return False
            if theirs.isdisjoint(mine):
                continue  # no program runs both files
            if referenced:
                return False
            for site in summary.sites.get(name, ()):
                if kind == "method" and not site.attribute:
                    continue
                calls += 1
                if site.no_grad:
                    continue
                if site.owner is None or not _covered(
                    index, site.owner, depth + 1, visiting, budget
                ):
                    return False
        return calls > 0
    finally:
        visiting.discard(key)


def _referenced(index: _Index, summary: _Summary, name: str, kind: str) -> bool:
    """Whether the file may use `name` other than by calling it: a callback, `getattr`."""
    if name in summary.strings or (kind == "function" and name in summary.names):
        return True
    receivers = summary.attributes.get(name)
    if not receivers:
        return False
    return not receivers <= _namespaces(index)


def _namespaces(index: _Index) -> set[str]:
    """The names the project binds to parsed command-line options (once per run)."""
    found = index.project.disk.get("grad_callers_namespaces")
    if not isinstance(found, set):
        found = set[str]()
        for path in index.files_naming("parse_") or ():
            for match in _PARSED_OPTIONS.finditer(index.text(path) or ""):
                found.add(match.group(1).rsplit(".", 1)[-1])
        index.project.disk["grad_callers_namespaces"] = found
    return found


# `args = parser.parse_args()`, `opt, _ = p.parse_known_args()`: names bound to parsed
# command-line options, whose attributes are option values, not methods
_PARSED_OPTIONS = re.compile(
    r"^[ \t]*([\w.]+)(?:[ \t]*,[ \t]*[\w.]+)*[ \t]*=[^\n=]*\.parse(?:_known)?_args\(", re.M
)


def _last_name(node: ast.expr) -> str:
    """`args` for `args` and `constant.args`; "" for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        return node.attr
    return ""


def _summarize(ctx: FileContext) -> _Summary:
    summary = _Summary()
    path = ctx.path.replace("\\", "/")
    project = ctx.project
    for node in ast.walk(ctx.tree):
        if isinstance(node, ast.Import):
            for alias in node.names:  # `import a.b` runs a/__init__.py too
                parts = alias.name.split(".")
                summary.imports.extend(".".join(parts[:i]) for i in range(1, len(parts) + 1))
        elif isinstance(node, ast.ImportFrom):
            base = "." * node.level + (node.module or "")
            summary.imports.append(base)
            sep = "" if base.endswith(".") else "."
            summary.imports.extend(base + sep + a.name for a in node.names if a.name != "*")
        elif isinstance(node, ast.ClassDef):
            allowed = _callers_seen_for(project, node)
            for stmt in node.body:
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and (
                    not allowed or (stmt.name in _MODULE_CALLED and _is_module(project, node))
                ):
                    summary.hidden.add((stmt.name, "method"))
    _Walker(ctx, summary, path).visit_body(ctx.tree.body, None, False)
    return summary


def _callers_seen_for(project: ProjectIndex, cls: ast.ClassDef) -> bool:
    """Whether every base of `cls` (and theirs) is the project's, `object` or nn.Module:
    no outside class's code calls its methods."""
    todo = [ast.unparse(b) for b in cls.bases]
    seen: set[str] = set()
    while todo:
        base = todo.pop()
        if base in seen or base in _PLAIN_BASES or base in _MODULE_BASES:
            continue
        seen.add(base)
        bases = project.bases.get(base.rsplit(".", 1)[-1])
        if bases is None:
            return False
        todo.extend(bases)
    return not cls.keywords  # a metaclass may call anything


def _is_module(project: ProjectIndex, cls: ast.ClassDef) -> bool:
    return cls.name in project.module_classes


class _Walker:
    """Records each call with the function it sits in and the gradient mode there."""

    def __init__(self, ctx: FileContext, summary: _Summary, path: str) -> None:
        self.ctx, self.summary, self.path = ctx, summary, path

    def visit_body(self, body: list[ast.stmt], owner: Key | None, no_grad: bool) -> None:
        for stmt in body:
            self.visit(stmt, owner, no_grad, in_class=None)

    def visit(self, node: ast.AST, owner: Key | None, no_grad: bool, in_class: object) -> None:
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            for expr in [*node.decorator_list, *node.args.defaults, *node.args.kw_defaults]:
                if expr is not None:
                    self.visit(expr, owner, no_grad, None)
            kind = "method" if isinstance(in_class, ast.ClassDef) else "function"
            inner: Key | None = None
            top = in_class is not None or (owner is None and self._at_module_level(node))
            if top:
                inner = (node.name, kind, self.path)
                if self._hides_callers(node):
                    self.summary.hidden.add((node.name, kind))
            off = is_no_grad_decorated(self.ctx, node)
            for stmt in node.body:
                self.visit(stmt, inner, off, None)
            return
        if isinstance(node, ast.ClassDef):
            for expr in [*node.decorator_list, *node.bases]:
                self.visit(expr, owner, no_grad, None)
            for stmt in node.body:
                # methods of a class nested in a function: callers not tracked
                self.visit(stmt, None, no_grad, node if owner is None else None)
            return
        if isinstance(node, ast.Lambda | ast.GeneratorExp):
            owner = None  # runs later, wherever it is called or consumed
        if isinstance(node, ast.With | ast.AsyncWith):
            for item in node.items:
                self.visit(item.context_expr, owner, no_grad, None)
                grad = with_item_context(self.ctx, item.context_expr, frozenset())
                if grad.no_grad:
                    no_grad = True
                elif grad.grad_switch:
                    no_grad = False
            for stmt in node.body:
                self.visit(stmt, owner, no_grad, None)
            return
        if isinstance(node, ast.Call):
            func = node.func
            name = func.id if isinstance(func, ast.Name) else None
            if isinstance(func, ast.Attribute):
                name = func.attr
                self.visit(func.value, owner, no_grad, None)
            if name is not None:
                self.summary.sites.setdefault(name, []).append(
                    _Site(owner, no_grad, isinstance(func, ast.Attribute))
                )
            elif not isinstance(func, ast.Attribute):
                self.visit(func, owner, no_grad, None)
            if name == "add_argument":
                return  # option names and destinations: strings, not method names
            for arg in [*node.args, *(k.value for k in node.keywords)]:
                self.visit(arg, owner, no_grad, None)
            return
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Load):
            self.summary.names.add(node.id)
        elif isinstance(node, ast.Attribute):
            self.summary.attributes.setdefault(node.attr, set()).add(_last_name(node.value))
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            self.summary.strings.add(node.value)
        elif isinstance(node, ast.Yield | ast.YieldFrom) and owner is not None:
            self.summary.hidden.add(owner[:2])  # a generator runs where it is consumed
        for child in ast.iter_child_nodes(node):
            self.visit(child, owner, no_grad, None)

    def _at_module_level(self, node: ast.AST) -> bool:
        # (a def under `if`/`try` at module level is one too)
        return node in self._module_defs

    @property
    def _module_defs(self) -> set[ast.AST]:
        found = getattr(self, "_defs", None)
        if found is None:
            found = set()
            todo: list[ast.stmt] = list(self.ctx.tree.body)
            while todo:
                stmt = todo.pop()
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                    found.add(stmt)
                elif isinstance(stmt, ast.If | ast.Try):
                    todo.extend([*stmt.body, *stmt.orelse])
            self._defs = found
        return found

    def _hides_callers(self, node: FuncNode) -> bool:
        """A coroutine runs where it is awaited (a generator: see `visit`); a decorator
        may register the function or change how it is called."""
        if isinstance(node, ast.AsyncFunctionDef):
            return True
        for dec in node.decorator_list:
            target = dec.func if isinstance(dec, ast.Call) else dec
            name = ast.unparse(target)
            last = name.rsplit(".", 1)[-1]
            if name not in _ALLOWED_DECORATORS and not (
                "no_grad" in last or "inference_mode" in last
            ):
                return True
        return False
