"""Cross-file call facts: what other files pass to a project's functions.

`evaluate(model, val_loader)` in train.py, after `model = Net().to(device)` and
`val_loader = DataLoader(...)`, tells engine.py's `def evaluate(model, loader)`
that its `model` is on the device and its `loader` yields CPU batches. The
flow library joins these facts with the calls it sees in the callee's own file
(see `FileFlow._call_site_seeds`).

Only files that can produce such a fact are analysed: their text mentions a
loader and a device move. Values are stripped of syntax-tree references so the
facts pickle cheaply to worker processes and hash into the cache fingerprint.
"""

from __future__ import annotations

import ast
import functools
import hashlib
import re
from collections.abc import Iterable, Iterator

from torchdoctor.check.analysis.builder_callers import builder_callers
from torchdoctor.check.analysis.dropped_device import CudaDefault, cuda_default_classes
from torchdoctor.check.analysis.file_flow import file_flow
from torchdoctor.check.analysis.file_loops import analysis
from torchdoctor.check.analysis.grad_contexts import (
    may_turn_grad_off,
    outside_calls,
)
from torchdoctor.check.analysis.grad_hooks import clamping_hooks, may_register_clamps
from torchdoctor.check.analysis.loss_arguments import loss_calls_of_import, may_hand_losses
from torchdoctor.check.analysis.method_facts import method_fact_name, portable
from torchdoctor.check.analysis.module_pickles import may_pickle_modules, project_pickles
from torchdoctor.check.analysis.saved_objects import project_saves
from torchdoctor.check.analysis.scope import ScopeFlow
from torchdoctor.check.analysis.text_facts import (
    LOADER_WORDS,
    batchnorm_classes,
    class_builds,
    cuda_extensions,
    logit_loss_classes,
    moving_classes,
    nccl_start,
    parameter_classes,
    plain_classes,
    self_moving_classes,
    starts_other_group,
    zeroing_calls,
)
from torchdoctor.check.analysis.values import UNKNOWN, AnyFunction, Kind, Value, sent_from
from torchdoctor.check.analysis.wraps import wrapped_arguments
from torchdoctor.check.context import FileContext
from torchdoctor.check.parsed_trees import forget, keep, plan, take
from torchdoctor.check.project import (
    CallFact,
    GenericFacts,
    LossCall,
    ModulePickles,
    ProjectIndex,
    SavedFile,
    WrappedFacts,
    scan_classes,
)
from torchdoctor.check.tree_walk import walk_lines

# A call that hands a loader to a function: `evaluate(model, val_loader)`: what
# `hands_a_loader` finds (tests/check/test_loader_argument.py: the same answer as a search
# for this pattern, which is tried at every word character of the text, 10 times slower)
LOADER_ARGUMENT = r"\w\s*\([^()\r\n]*(?:loader|Loader|_dl\b)"
_WORD = re.compile(r"\w")


def hands_a_loader(source: str) -> bool:
    """Whether `LOADER_ARGUMENT` matches in `source`: a loader word (`_dl` ending a word)
    after the last bracket of its line, that bracket a `(` whose last non-blank
    character before it is a word character."""
    for word in ("loader", "Loader", "_dl"):
        at = source.find(word)
        while at >= 0:
            end = at + len(word)
            if word != "_dl" or end == len(source) or not _WORD.match(source, end):
                line = max(source.rfind("\n", 0, at), source.rfind("\r", 0, at)) + 1
                bracket = max(source.rfind("(", line, at), source.rfind(")", line, at))
                if bracket >= 0 and source[bracket] == "(":
                    before = bracket - 1
                    while before >= 0 and source[before].isspace():  # `\s*`, lines too
                        before -= 1
                    if before >= 0 and _WORD.match(source, before):
                        return True
            at = source.find(word, at + 1)
    return False


_MOVES = (".to(", ".cuda(")
# A loop over a loader: `for x in loader:`, `for i, b in enumerate(val_loader):`.
_FOR_IN_LOADER = re.compile(r"for[ \t][^\r\n:]*?\bin\b[^\r\n:]*?(?:loader|Loader|_dl\b)")


def _contexts(index: ProjectIndex, files: Iterable[tuple[str, str]]) -> Iterator[FileContext]:
    """A FileContext for each (path, text) that parses, closed when the caller moves on
    (a file too deep for the analysis, RecursionError, is skipped)."""
    for path, source in files:
        try:
            tree = take(path, source) or ast.parse(source)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            continue
        ctx = FileContext(path, source, tree, index)
        try:
            yield ctx
        finally:
            ctx.close()
            keep(path, source, tree)  # for the check of the file, or another fact's read


def collect(
    index: ProjectIndex,
    files: Iterable[tuple[str, str]],
    method_only: frozenset[str] = frozenset(),
) -> dict[str, tuple[CallFact, ...]]:
    """Callee name -> the facts of its calls in `files` ((path, text) pairs); of the
    files in `method_only`, the calls of module classes' methods only."""
    facts: dict[str, list[CallFact]] = {}
    for ctx in _contexts(index, files):
        sender = _Sender(ctx, ctx.path in method_only)
        ff = file_flow(ctx)
        scopes: list[ast.AST] = [ctx.tree]
        scopes.extend(
            f for f in ff.functions() if ff.mentions(f, "loader", "Loader", "_dl") and sender.may(f)
        )
        try:
            for node in scopes:
                for fact in sender.facts(ff.scope(node)):  # type: ignore[arg-type]
                    facts.setdefault(fact.callee, []).append(fact)
        except RecursionError:
            continue
    return {name: tuple(found) for name, found in facts.items()}


class _Sender:
    """The call facts one file's scopes send to the files they call."""

    def __init__(self, ctx: FileContext, methods_only: bool) -> None:
        self.ctx, self.methods_only = ctx, methods_only
        self.local = {
            stmt.name
            for stmt in ctx.tree.body
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
        }
        self.imported = {
            name
            for name, target in ctx.imports.items()
            if not target.startswith(("torch", "numpy", "os", "sys"))
        }
        outside = self.imported - self.local
        self._names = () if methods_only else tuple(outside)
        self._on_modules = not outside.isdisjoint(ctx.project.module_classes)

    def may(self, func: AnyFunction) -> bool:
        """False when `func` certainly sends nothing. A fact is a call `name(...)` of a
        name imported here and not defined here (a call site's callee is the called
        name), or a method call on a module of such a name's class (`method_fact_name`;
        the file imports one)."""
        if self._on_modules:
            return True
        if not file_flow(self.ctx).mentions(func, *self._names):
            return False
        names = set(self._names)
        return any(
            isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id in names
            for node in ast.walk(func)
        )

    def facts(self, scope: ScopeFlow) -> Iterator[CallFact]:
        path, imports = self.ctx.path, self.ctx.imports
        for site in scope.calls:
            name = site.callee
            receiver = None
            send = _portable
            if site.receiver is not None:
                method = method_fact_name(site, self.imported, self.local)
                if method is None:
                    continue
                receiver, send = portable(site.receiver, path), portable
                target = imports[name.split(".", 1)[0]]
            elif (
                self.methods_only or name in self.local or name not in self.imported or "." in name
            ):
                continue
            else:
                target = imports[name]
            args = tuple(send(v, path) for v in site.args)
            keywords = tuple((k, send(v, path)) for k, v in site.keywords)
            if not any(v is not UNKNOWN for v in args) and not any(
                v is not UNKNOWN for _, v in keywords
            ):
                continue
            yield CallFact(name, path, args, keywords, site.opaque, target, receiver)


def _portable(value: Value, path: str) -> Value:
    """The part of a value worth sending to another file (UNKNOWN if nothing)."""
    if value.kind not in (Kind.MODULE, Kind.LOADER, Kind.DEVICE) or value.assumed:
        return UNKNOWN
    return sent_from(value, path)


# A top-level `class` line; lines may end in \n, \r\n or a lone \r.
def build_project(sources: Iterable[str | tuple[str, str]]) -> ProjectIndex:
    """Index `sources`: texts, or (path, text) pairs (paths name files in messages)."""
    index = ProjectIndex()
    forget()  # the trees an earlier run's index parsed
    candidates: list[tuple[str, str]] = []
    wrapping: list[tuple[str, str]] = []  # files that may hand a wrapped model on
    generic: list[tuple[str, str]] = []  # files that build a generic class `C[T](...)`
    pickling: list[tuple[str, str]] = []  # files that may pickle a whole module
    saving: list[tuple[str, str]] = []  # files that may torch.save a non-tensor object
    losses: list[tuple[str, str]] = []  # files that may hand a torch loss on
    moving: set[str] = set()
    parameters: set[str] = set()
    logit_losses: set[str] = set()
    extensions: set[str] = set()
    classes: dict[str, list[tuple[bool, frozenset[str]]]] = {}
    definitions: dict[str, int] = {}  # class name -> how many files define it
    self_moving: dict[str, list[bool]] = {}  # class name -> maybe, per defining file
    # files that pass a loader on without moving anything: candidates if they build a
    # class that moves itself (known only once every file is scanned)
    unmoved: list[tuple[str, str]] = []
    # files that move something and iterate a loader, passing no loader on: what they
    # pass a project module's own method (`model.read(images=batch)`) only
    iterating: list[tuple[str, str]] = []
    class_files: dict[str, list[str]] = {}
    calling: dict[str, list[str]] = {}  # method name -> files calling it (not on self)
    cuda_defaults: dict[str, CudaDefault] = {}
    count = 0
    other_group = False  # a file starts a process group of another backend
    paths: set[str] = set()
    for item in sources:
        path, source = item if isinstance(item, tuple) else ("", item)
        plan(path)  # the run checks its files in this order (parsed_trees keeps by it)
        paths.add(path.replace("\\", "/"))
        file_classes = scan_classes(source)
        index.add(file_classes)
        for name in file_classes:
            definitions[name] = definitions.get(name, 0) + 1
        if path:
            for name in {*file_classes, *plain_classes(source)}:
                class_files.setdefault(name, []).append(path)
        moving |= moving_classes(source)
        for name, maybe in self_moving_classes(source).items():
            self_moving.setdefault(name, []).append(maybe)
        parameters |= parameter_classes(source)
        logit_losses |= logit_loss_classes(source)
        index.nccl_start = index.nccl_start or nccl_start(path, source)
        other_group = other_group or starts_other_group(source)
        zeroing = zeroing_calls(source)
        if zeroing is not None:
            index.zeroing_calls |= zeroing
        extensions |= cuda_extensions(source)
        if not index.turns_grad_off:  # once one file does, the method names are not asked
            index.turns_grad_off = may_turn_grad_off(source)
            if index.turns_grad_off:
                calling.clear()
            else:
                for name in outside_calls(source):
                    calling.setdefault(name, []).append(path)
        cuda_defaults.update(cuda_default_classes(path, source))
        for name, facts in class_builds(source).items():
            classes.setdefault(name, []).append(facts)
        count += 1
        # a candidate: it may pass a moved model or a loader to another file's function
        loads = any(w in source for w in LOADER_WORDS)
        moves = loads and any(m in source for m in _MOVES)
        if moves and hands_a_loader(source):
            candidates.append((path, source))
        elif moves and _FOR_IN_LOADER.search(source) is not None:
            iterating.append((path, source))  # may call a module's method on a batch
        elif loads and not moves:
            unmoved.append((path, source))
        if ("DataParallel" in source or "DDP" in source) and _WRAPS.search(source):
            wrapping.append((path, source))
        if builds_generic(source):
            generic.append((path, source))
        if may_pickle_modules(source):
            pickling.append((path, source))
        if "save(" in source and _SAVES.search(source):
            saving.append((path, source))
        if may_hand_losses(source):
            losses.append((path, source))
        if may_register_clamps(source):
            for name, where in clamping_hooks(path, source).items():
                index.clamping_hooks.setdefault(name, where)
    index.paths = frozenset(paths)
    if other_group:  # several programs, one of which may start a group without NCCL
        index.nccl_start = None
    if not index.turns_grad_off:
        index.outside_calls = {name: tuple(files) for name, files in calling.items()}
    index.moving_classes = frozenset(moving)
    index.cuda_extensions = frozenset(extensions)
    index.batchnorm_classes = batchnorm_classes(classes, definitions)
    index.class_files = {name: tuple(files) for name, files in class_files.items()}
    # a class name defined in two files: which one a call builds is not known
    index.cuda_defaults = {n: f for n, f in cuda_defaults.items() if definitions.get(n) == 1}
    index.resolve()
    # a name defined in several files counts only if every definition moves itself
    index.self_moving = {
        name: any(maybes)
        for name, maybes in self_moving.items()
        if len(maybes) == definitions.get(name) and name in index.module_classes
    }
    if index.self_moving:
        candidates += [
            (path, source)
            for path, source in unmoved
            if any(f"{name}(" in source for name in index.self_moving) and hands_a_loader(source)
        ]
    if unmoved and count > 1:  # scripts holding a model another file's builder moved
        passing = [f for f in unmoved if f not in candidates and hands_a_loader(f[1])]
        candidates += builder_callers(index, passing)
    index.parameter_classes = index.subclasses_of(parameters)
    index.logit_losses = index.module_classes.intersection(logit_losses)
    if iterating and index.module_classes:
        candidates += iterating
    if candidates and count > 1:  # a lone file sees its own calls directly
        method_only = frozenset(path for path, _ in iterating)
        index.call_facts = collect(index, candidates, method_only)
        index.method_classes = frozenset(
            name.split(".", 1)[0] for name in index.call_facts if "." in name
        )
    if wrapping and count > 1:  # a lone file sees its own wraps
        index.wrapping_files = tuple(wrapping)
        index.wrapped_build = _wrapped_arguments
        index.wrapped_digest = _texts_digest(wrapping)
    if generic:
        names = frozenset(index.bases)
        index.generic_build = functools.partial(generic_arguments, names, tuple(generic))
        text = "\n".join(sorted(names)) + "".join(f"\0{p}\0{s}" for p, s in generic)
        index.generic_digest = hashlib.sha1(text.encode("utf-8", "surrogatepass")).hexdigest()
    if saving and count > 1:  # a lone file matches its own saves
        index.saving_files = tuple(saving)
        index.saves_build = _saved_files
        index.saves_digest = _texts_digest(saving)
    if losses and count > 1:  # a lone file sees its own calls
        index.loss_files = tuple(losses)
        index.loss_build = _loss_arguments
        index.loss_digest = _texts_digest(losses)
    if pickling and count > 1:  # a lone file sees its own pickles
        index.pickles_build = functools.partial(_module_pickles, tuple(pickling))
        index.pickles_digest = _texts_digest(pickling)
    return index


def _module_pickles(files: tuple[tuple[str, str], ...], index: ProjectIndex) -> ModulePickles:
    """The whole-module pickles of `files` (ProjectIndex.module_pickles)."""
    return tuple(site for ctx in _contexts(index, files) for site in project_pickles(ctx))


# A `torch.save(` call (or `serialization.save(`): a file whose saves TD406 may ask about.
_SAVES = re.compile(r"(?:torch|serialization)\.save\s*\(")
# A model wrapped here (`DataParallel(model)`, `DDP(model, ...)`), to be handed on.
_WRAPS = re.compile(r"(?:DataParallel|DDP)\s*\(")  # DistributedDataParallel( too
# `Store[Record](...)`: a generic class built with a class as its type argument.
# (found from its `[T](` tail, which starts with a literal: a pattern that starts with
# `\b[A-Z]` is tried at every position of every file, 30 times slower on torch's tree)
_GENERIC_TAIL = re.compile(r"\[\s*[A-Za-z_][\w.]*\s*\]\s*\(")
_CLASS_NAME_END = re.compile(r"(?<!\w)[A-Z]\w*$")


def _generic_builds(source: str) -> Iterator[int]:
    """Offsets of `Name[T](` in `source`: a capitalized name subscripted, then called."""
    for match in _GENERIC_TAIL.finditer(source):
        start = match.start()
        if _CLASS_NAME_END.search(source, max(0, start - 100), start):
            yield start


def builds_generic(source: str) -> bool:
    return next(_generic_builds(source), None) is not None


def generic_arguments(classes: frozenset[str], files: Iterable[tuple[str, str]]) -> GenericFacts:
    """Generic class name -> the classes of the project it is built with as a type
    argument (`ObjectStore[Record](root)`): a class the project defines (in the building
    file, or with bases anywhere), or one imported
    from the package the building file belongs to (its top package names a folder of
    the file's path)."""
    found: dict[str, list[tuple[str, str, int]]] = {}
    for ctx in _contexts(ProjectIndex(), files):  # the class names are all it needs
        path, tree = ctx.path, ctx.tree
        folders = set(re.split(r"[\\/]", path)[:-1])
        local = {c.name for c in tree.body if isinstance(c, ast.ClassDef)}
        lines = sorted({ctx.line_of_offset(at) for at in _generic_builds(ctx.source)})
        for node in walk_lines(tree, lines):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Subscript)):
                continue
            generic, argument = node.func.value, node.func.slice
            if not isinstance(argument, ast.Name | ast.Attribute):
                continue
            name = ctx.qualname(argument) or ""
            owner = name.split(".", 1)[0]
            last = name.rsplit(".", 1)[-1]
            if name in local or last in classes or ("." in name and owner in folders):
                cls = ast.unparse(generic).rsplit(".", 1)[-1]
                found.setdefault(cls, []).append((name, path, node.lineno))
    return {name: tuple(sorted(facts)) for name, facts in found.items()}


def _wrapped_arguments(index: ProjectIndex, path: str, source: str) -> WrappedFacts:
    """Function name -> the models wrapped in DataParallel/DDP that the file hands it."""
    for ctx in _contexts(index, [(path, source)]):
        try:
            return {name: tuple(facts) for name, facts in wrapped_arguments(ctx).items()}
        except RecursionError:
            break
    return {}


def _loss_arguments(index: ProjectIndex, path: str, source: str, name: str) -> tuple[LossCall, ...]:
    """The calls of the imported function `name` in the file, with the losses they pass."""
    for ctx in _contexts(index, [(path, source)]):
        return tuple(loss_calls_of_import(analysis(ctx), name))
    return ()


def _saved_files(index: ProjectIndex, path: str, source: str) -> tuple[SavedFile, ...]:
    """The file's saves of non-tensor objects, by the file name they write."""
    for ctx in _contexts(index, [(path, source)]):
        try:
            return project_saves(ctx)
        except RecursionError:
            break
    return ()


def _texts_digest(files: Iterable[tuple[str, str]]) -> str:
    """A digest of (path, text) pairs: the inputs of a project fact built on demand."""
    digest = hashlib.sha1()
    for path, source in files:
        digest.update(f"\0{path}\0{source}".encode("utf-8", "surrogatepass"))
    return digest.hexdigest()
