"""Cross-file facts: which classes in the checked tree are nn.Module subclasses.

Built before any rule runs from a fast text scan of every file (no parse), so
that `class Net(BaseModel)` in one file and `class BaseModel(nn.Module)` in
another are both known to be modules, through any chain of inheritance.
"""

from __future__ import annotations

import hashlib
import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from torchdoctor.check.analysis.torch_api import LIBRARY_MODULE_BASES
from torchdoctor.check.analysis.values import Passed, Value
from torchdoctor.check.lines import as_lf
from torchdoctor.check.text_calls import writes_call

# Base classes from torch and its ecosystem that make a class a module.
KNOWN_MODULE_BASES = frozenset(
    {
        "Module",
        "Sequential",
        "ModuleList",
        "ModuleDict",
        "LightningModule",
        "PreTrainedModel",
        "ScriptModule",
    }
)
_TORCH_NN_PREFIXES = ("nn.", "torch.nn.")


def _base_is_torch_module(base: str) -> bool:
    """`nn.Linear`, `torch.nn.Module`, `Module`: a torch.nn layer (capitalised name); or
    a module class of another library, named in full (`allennlp.models.Model`)."""
    last = base.rsplit(".", 1)[-1]
    if last in KNOWN_MODULE_BASES or base in LIBRARY_MODULE_BASES:
        return True
    return base.startswith(_TORCH_NN_PREFIXES) and last[:1].isupper()


# (indent, offset where the header ends, class name, the bases' text or None for
# `class X:`), offsets in the text with `\n` line ends
ClassHeader = tuple[int, int, str, str | None]
# A class header, `class Name(bases...)` (bases may span lines; nested brackets are rare
# in bases) or `class Record:`: every class the project defines. Its line start, only
# blanks before `class`, is checked by `class_headers`: a pattern that starts with a
# literal is not tried at every position of the text
# (tests/check/test_class_headers.py: the same matches as `^[ \t]*` + this, re.MULTILINE)
_CLASS_WORD = re.compile(r"class[ \t]+(\w+)[ \t]*(?:\(([^()]*)\)|:)")
_HEADERS: list[tuple[str, str, list[ClassHeader]]] = []  # the last text's (see below)


def class_headers(source: str) -> tuple[str, list[ClassHeader]]:
    """(`source` with `\n` line ends, the class headers in it: `_CLASS_WORD` matches
    with only blanks before them on their line, in the order `finditer` would give).
    The project index asks several times per file (`scan_classes`, text_facts' class
    bodies): the last text's are kept."""
    if _HEADERS and _HEADERS[0][0] is source:
        return _HEADERS[0][1], _HEADERS[0][2]
    text = as_lf(source)
    found: list[ClassHeader] = []
    at = 0
    search = _CLASS_WORD.search
    match = search(text) if "class" in text else None
    while match is not None:
        start = match.start()
        line = text.rfind("\n", 0, start) + 1
        # only blanks before `class` on its line, at or after where the search resumed
        if line >= at and not text[line:start].strip(" \t"):
            found.append((start - line, match.end(), match.group(1), match.group(2)))
            at = match.end()
        else:  # not a header: the next try starts one character on, as `finditer` would
            at = start + 1
        match = search(text, at)
    _HEADERS[:] = [(source, text, found)]
    return text, found


def scan_classes(source: str) -> dict[str, list[str]]:
    """Class name -> base expressions (as text) for every class header in `source`
    (no bases: an empty list)."""
    found: dict[str, list[str]] = {}
    if "class" not in source:
        return found
    for _, _, name, listed in class_headers(source)[1]:
        bases = []
        for part in (listed or "").split(","):
            part = part.strip()
            if part and "=" not in part:  # skip metaclass=..., other keywords
                bases.append(part.split("[", 1)[0].strip())
        found.setdefault(name, []).extend(bases)
    return found


GenericFacts = dict[str, tuple[tuple[str, str, int], ...]]
# Function name -> (parameter position or keyword, the wrapped model handed there).
WrappedFacts = dict[str, tuple[tuple[str, Passed], ...]]
# (where "path:line", the call's text, the module class or "", the file's imported names)
ModulePickles = tuple[tuple[str, str, str, tuple[str, ...]], ...]


# A name followed by `(`: what a file may call (a superset; attribute calls too).
@dataclass(frozen=True)
class CallFact:
    """One call of a function (or class) of the project, seen in another file."""

    callee: str
    path: str
    args: tuple[Value, ...]
    keywords: tuple[tuple[str, Value], ...]
    opaque: bool  # *args / **kwargs at the call: positions unknown
    # What the calling file imported the callee as (`utils.test`, `..models.Net`): the
    # fact seeds only a definition in a file that import can name.
    target: str = ""
    # `Reader.read` of a module class: the module it is called on (where it is)
    receiver: Value | None = None


_IDENTIFIER_CHARS = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_"


def _called_names(source: str) -> set[str]:
    """The ASCII names written right before a `(` (a superset of the functions the text
    calls): a split, several times faster than a pattern over long texts."""
    found = set()
    for part in source.split("(")[:-1]:
        name = part[len(part.rstrip(_IDENTIFIER_CHARS)) :]
        if name:
            found.add(name)
    return found


@dataclass(frozen=True)
class LossCall:
    """A call of a function that may hand it a torch loss (analysis/loss_arguments.py)."""

    target: str  # what the calling file imported the callee as
    path: str
    line: int
    caller: str  # the calling function's name
    slots: tuple[tuple[str, str], ...]  # (position or keyword, loss kind or "")
    opaque: bool  # *args / **kwargs at the call: positions unknown


@dataclass(frozen=True)
class SavedFile:
    """One `torch.save` of the project to a named file (TD406, TD402)."""

    key: str  # the file name it writes (analysis/saved_objects.file_keys)
    path: str
    line: int
    what: str  # the non-tensor object it writes, "a NumPy array (`.to_numpy()`)", or ""
    cpu: bool = False  # it writes CPU tensors only (analysis/cpu_saves.saved_on_cpu)


def _module_parts(path: str) -> list[str]:
    """`pkg/sub/mod.py` -> [pkg, sub, mod]; a package's `__init__.py` is the package."""
    parts = path.replace("\\", "/").split("/")
    parts[-1] = parts[-1].rsplit(".", 1)[0]
    return parts[:-1] if parts[-1] == "__init__" else parts


def may_name(importer: str, target: str, definer: str, paths: frozenset[str]) -> bool:
    """Whether `from M import f` / `import M` in `importer` (target `M.f`) can bind the
    `f` that `definer` defines. Relative imports resolve exactly; an absolute one names
    a file whose module path ends with `M`, and the importer's own folder comes first
    (a script's folder is the head of sys.path), so two `utils.py` of two example
    folders do not feed each other's functions."""
    if "." in target.lstrip("."):
        module = target.rsplit(".", 1)[0]
    else:  # `from . import f`: the package itself; `import f`: nothing to resolve
        module = target[: len(target) - len(target.lstrip("."))]
    if not module:
        return True
    parts = _module_parts(definer)
    # the module itself, or a module of that package (re-exported by its __init__)
    named = [parts, parts[:-1]]
    folder = importer.replace("\\", "/").split("/")[:-1]
    if module.startswith("."):
        level = len(module) - len(module.lstrip("."))
        base = folder[: len(folder) - (level - 1)] if level > 1 else folder
        return base + [p for p in module.lstrip(".").split(".") if p] in named
    wanted = module.split(".")
    local = "/".join(folder + wanted)
    if f"{local}.py" in paths or f"{local}/__init__.py" in paths:
        return folder + wanted in named
    return any(candidate[-len(wanted) :] == wanted for candidate in named)


@dataclass
class ProjectIndex:
    """Class facts for the whole checked tree."""

    bases: dict[str, set[str]] = field(default_factory=dict)
    module_classes: frozenset[str] = frozenset()
    # Callee name -> calls of it in other files that pass a moved model or a loader
    # (analysis/project_facts.py; used by the device rules' dataflow).
    call_facts: dict[str, tuple[CallFact, ...]] = field(default_factory=dict)
    # The module classes whose own methods other files call (`Reader.read` facts above)
    method_classes: frozenset[str] = frozenset()
    # Classes that move data to the device themselves (text_facts.moving_classes).
    moving_classes: frozenset[str] = frozenset()
    # Module classes that move themselves in `__init__` (`self.cuda()`), class name ->
    # whether only on some paths (under a flag; `if torch.cuda.is_available():` is the
    # target device, not a path) (analysis/text_facts.self_moving_classes).
    self_moving: dict[str, bool] = field(default_factory=dict)
    # Classes that build a BatchNorm1d layer, themselves or through another such class
    # they build (analysis/project_facts.batchnorm_classes; TD216 asks).
    batchnorm_classes: frozenset[str] = frozenset()
    # Where a file of the project starts an NCCL process group ("path:line"), if one does
    # (analysis/text_facts.nccl_start; TD113 asks).
    nccl_start: str | None = None
    # Extension modules the project builds with `CUDAExtension(...)` (its setup.py):
    # code importing one runs only with a GPU (analysis/text_facts.cuda_extensions).
    cuda_extensions: frozenset[str] = frozenset()
    # The files that may hand a model wrapped in DataParallel/DDP to a function of another
    # file, (path, text). Each is analysed (`wrapped_build`, analysis/wraps.py) only when
    # a file asks about a function it calls (`wrapped_arguments_for`; TD404): few ever
    # do, and the analysis is a flow analysis of every function of the file.
    wrapping_files: tuple[tuple[str, str], ...] = ()
    wrapped_build: Callable[[ProjectIndex, str, str], WrappedFacts] | None = None
    wrapped_digest: str = ""  # of the wrapping files (the cache fingerprint)
    _wrapped: dict[str, WrappedFacts] = field(default_factory=dict, repr=False, compare=False)
    _called: dict[str, dict[str, bool]] = field(default_factory=dict, repr=False, compare=False)
    # The files whose text holds a `torch.save`, (path, text). Each is analysed
    # (`saves_build`, analysis/saved_objects.project_saves) only when a file loads a file
    # name it does not write itself and the text holds that name (`saved_files_for`;
    # TD406 asks what objects it writes, TD402 whether it writes CPU tensors only).
    saving_files: tuple[tuple[str, str], ...] = ()
    saves_build: Callable[[ProjectIndex, str, str], tuple[SavedFile, ...]] | None = None
    saves_digest: str = ""  # of the saving files (the cache fingerprint)
    _saves: dict[str, tuple[SavedFile, ...]] = field(
        default_factory=dict, repr=False, compare=False
    )
    # Builds `generic_arguments` on first use: few files ever ask (TD406, for `obj: T`
    # parameters), and building means parsing every file that writes `Name[T](`.
    # A partial of a module-level function, so the index still pickles to workers.
    generic_build: Callable[[], GenericFacts] | None = None
    generic_digest: str = ""  # of what generic_build reads (the cache fingerprint)
    _generic: GenericFacts | None = field(default=None, repr=False, compare=False)
    # The folder the run checks from (the config root, or the working directory): rules
    # that judge a file by its path judge the part inside the project, not where the
    # project happens to live (`~/benchmarks/myproj/train.py` is no benchmark file).
    root: str = ""
    # The method names called in files that zero gradients (zero_grad, `p.grad = None`):
    # TD204 asks whether another file may zero around a step method it calls
    # (analysis/text_facts.zeroing_calls).
    zeroing_calls: frozenset[str] = frozenset()
    # Whether some file of the project turns gradients off (no_grad, inference_mode, or
    # a framework whose evaluation runs under no_grad): if none does, every forward pass
    # of the project records its graph (analysis/grad_contexts.may_turn_grad_off).
    turns_grad_off: bool = False
    # Method name -> the files that call it through a receiver other than `self`
    # (`model.module.mask_net(...)`), kept only while no file turns gradients off: TD202
    # asks whether the project's own code (not its tests) runs an inference-only method.
    outside_calls: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Class name -> the files of the project that define a class of that name: what a
    # method of an object built from it does is read there, on demand
    # (analysis/kept_state.py; TD206 asks whether `meter.update(loss)` keeps `loss`).
    class_files: dict[str, tuple[str, ...]] = field(default_factory=dict)
    # Class name -> (parameter, its position after `self` (-1: keyword-only), the CUDA
    # literal, file, line) for a class defined once in the project whose `__init__`
    # takes a device that defaults to CUDA (`device="cuda"`) and uses it
    # (analysis/dropped_device.py; TD101 asks at calls that leave it out).
    cuda_defaults: dict[str, tuple[str, int, str, str, int]] = field(default_factory=dict)
    # Builds `module_pickles` on first use: only TD405 asks, only in a file whose module
    # classes store a lambda, and building means parsing every file that may pickle one.
    # A partial of a module-level function, so the index still pickles to workers.
    pickles_build: Callable[[ProjectIndex], ModulePickles] | None = None
    pickles_digest: str = ""  # of the files pickles_build reads (the cache fingerprint)
    _pickles: ModulePickles | None = field(default=None, repr=False, compare=False)
    # Module-level function name -> "path:line" where it registers gradient hooks that
    # clamp or clip each gradient (analysis/grad_hooks.py; TD606 asks where a GradScaler
    # scales the gradients those hooks see).
    clamping_hooks: dict[str, str] = field(default_factory=dict)
    # Every checked file's path (imports are resolved against them).
    paths: frozenset[str] = frozenset()
    # Classes that make an `nn.Parameter` in their body, and their subclasses
    # (analysis/text_facts.parameter_classes; TD213 asks where one is built).
    parameter_classes: frozenset[str] = frozenset()
    # Module classes whose body names a loss or activation that takes logits
    # (`binary_cross_entropy_with_logits`, `log_softmax`): a file that builds one may
    # call a project loss taking logits (analysis/text_facts.logit_loss_classes; TD301,
    # TD302 read the class where a file calls it).
    logit_losses: frozenset[str] = frozenset()
    # The files whose text names a torch loss, (path, text): what they pass to the
    # functions they import (`loss_build`, analysis/loss_arguments.py), read only when a
    # file calls a parameter of a function it defines (`loss_arguments_for`; TD301/TD302).
    loss_files: tuple[tuple[str, str], ...] = ()
    loss_build: Callable[[ProjectIndex, str, str, str], tuple[LossCall, ...]] | None = None
    loss_digest: str = ""  # of the loss files (the cache fingerprint)
    _loss_callees: frozenset[str] | None = field(default=None, repr=False, compare=False)
    _losses: dict[tuple[str, str], tuple[LossCall, ...]] = field(
        default_factory=dict, repr=False, compare=False
    )
    # What rules read from the file system on demand this run, by key (a file's presence,
    # a folder's packaging metadata: analysis/library_package.py): once per run, not per
    # file, and never stale in a long-lived process (each run builds a new index).
    disk: dict[str, object] = field(default_factory=dict, repr=False, compare=False)

    @property
    def generic_arguments(self) -> GenericFacts:
        """Generic class name -> the project classes it is built with as a type argument
        (`Store[Record](...)`): (the argument's dotted name, file, line)
        (analysis/project_facts.generic_arguments)."""
        if self._generic is None:
            self._generic = self.generic_build() if self.generic_build is not None else {}
        return self._generic

    @property
    def module_pickles(self) -> ModulePickles:
        """Calls of the project that pickle a whole module: (where "path:line", the
        call's text, the module class or "" when the code does not show which, the
        dotted names its file imports) (analysis/module_pickles.py; TD405 asks in
        files that pickle nothing themselves)."""
        if self._pickles is None:
            self._pickles = self.pickles_build(self) if self.pickles_build is not None else ()
        return self._pickles

    def wrapped_arguments_for(self, names: Iterable[str]) -> WrappedFacts:
        """Function name (of `names`) -> (parameter position or keyword, fact) for the
        calls of the project that hand it a model wrapped on some path."""
        wanted = set(names)
        found: dict[str, list[tuple[str, Passed]]] = {}
        if not wanted or self.wrapped_build is None:
            return {}
        for path, source in self.wrapping_files:
            # whether the file may call one, by name: a gate before the analysis
            called = self._called.setdefault(path, {})
            for name in wanted:
                if name not in called:
                    called[name] = writes_call(source, name)
            if not any(called[name] for name in wanted):
                continue
            facts = self._wrapped.get(path)
            if facts is None:
                facts = self._wrapped[path] = self.wrapped_build(self, path, source)
            for name in wanted.intersection(facts):
                found.setdefault(name, []).extend(facts[name])
        return {name: tuple(facts) for name, facts in found.items()}

    def loss_callees_among(self, names: Iterable[str]) -> frozenset[str]:
        """Those of `names` a file handing on a torch loss may call (`name(` in its text)."""
        if self.loss_build is None:
            return frozenset()
        if self._loss_callees is None:  # once per run: the loss files may be long
            self._loss_callees = frozenset(
                name for _, source in self.loss_files for name in _called_names(source)
            )
        return self._loss_callees.intersection(names)

    def loss_arguments_for(self, name: str, path: str) -> tuple[LossCall, ...]:
        """The calls in other files, of those naming a torch loss, of the function `name`
        that `path` defines."""
        if self.loss_build is None:
            return ()
        found: list[LossCall] = []
        for other, source in self.loss_files:
            if other == path or f"{name}(" not in source:
                continue
            calls = self._losses.get((other, name))
            if calls is None:
                calls = self._losses[other, name] = self.loss_build(self, other, source, name)
            found.extend(c for c in calls if may_name(other, c.target, path, self.paths))
        return tuple(found)

    def saved_files_for(self, keys: Iterable[str]) -> tuple[SavedFile, ...]:
        """The saves of the project to a file one of `keys` names."""
        wanted = set(keys)
        if not wanted or self.saves_build is None:
            return ()
        # the text a writer must hold (`model.pt`, the constant's last name): a gate
        gates = {
            key.split(":", 1)[1].rsplit(".", 1)[-1]
            if key.startswith("const:")
            else key.split(":", 1)[1]
            for key in wanted
        }
        found: list[SavedFile] = []
        for path, source in self.saving_files:
            if not any(gate in source for gate in gates):
                continue
            facts = self._saves.get(path)
            if facts is None:
                facts = self._saves[path] = self.saves_build(self, path, source)
            found.extend(fact for fact in facts if fact.key in wanted)
        return tuple(found)

    def call_facts_for(self, callee: str, path: str) -> list[CallFact]:
        """Calls of `callee` seen in files other than `path` whose import names `path`."""
        return [
            f
            for f in self.call_facts.get(callee, ())
            if not path or (f.path != path and may_name(f.path, f.target, path, self.paths))
        ]

    def add(self, classes: dict[str, list[str]]) -> None:
        for name, bases in classes.items():
            self.bases.setdefault(name, set()).update(bases)

    def resolve(self) -> None:
        """Close over inheritance: a class is a module if any base is one."""
        modules: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, bases in self.bases.items():
                if name in modules:
                    continue
                for base in bases:
                    if _base_is_torch_module(base) or base.rsplit(".", 1)[-1] in modules:
                        modules.add(name)
                        changed = True
                        break
        self.module_classes = frozenset(modules)

    def subclasses_of(self, names: set[str]) -> frozenset[str]:
        """`names` and every class of the tree that inherits from one of them."""
        found = set(names)
        changed = bool(found)
        while changed:
            changed = False
            for name, bases in self.bases.items():
                if name not in found and any(b.rsplit(".", 1)[-1] in found for b in bases):
                    found.add(name)
                    changed = True
        return frozenset(found)

    def fingerprint(self) -> str:
        """Changes whenever the set of module classes changes (part of the cache key)."""
        text = "\n".join(sorted(self.module_classes))
        if self.moving_classes:
            text += "\nmoving:" + ",".join(sorted(self.moving_classes))
        if self.nccl_start:
            text += "\nnccl:" + self.nccl_start
        if self.cuda_extensions:
            text += "\ncuda-extensions:" + ",".join(sorted(self.cuda_extensions))
        if self.self_moving:
            text += "\nself-moving:" + repr(sorted(self.self_moving.items()))
        if self.batchnorm_classes:
            text += "\nbatchnorm:" + ",".join(sorted(self.batchnorm_classes))
        if self.generic_digest:
            text += "\ngeneric:" + self.generic_digest
        if self.wrapped_digest:
            text += "\nwrapped:" + self.wrapped_digest
        if self.saves_digest:
            text += "\nsaves:" + self.saves_digest
        if self.loss_digest:
            text += "\nlosses:" + self.loss_digest
        if self.cuda_defaults:
            text += "\ncuda-defaults:" + repr(sorted(self.cuda_defaults.items()))
        if self.zeroing_calls:
            text += "\nzeroing:" + ",".join(sorted(self.zeroing_calls))
        if self.turns_grad_off:
            text += "\ngrad-off"
        if self.outside_calls:
            text += "\noutside-calls:" + _digest_text(repr(sorted(self.outside_calls.items())))
        if self.clamping_hooks:
            text += "\nclamping:" + repr(sorted(self.clamping_hooks.items()))
        if self.pickles_digest:
            text += "\npickles:" + self.pickles_digest
        if self.parameter_classes:
            text += "\nparameters:" + ",".join(sorted(self.parameter_classes))
        if self.logit_losses:
            text += "\nlogit-losses:" + ",".join(sorted(self.logit_losses))
        if self.class_files:
            text += "\nclass-files:" + _digest_text(repr(sorted(self.class_files.items())))
        if self.call_facts:  # and whenever the cross-file call facts change
            text += "\n" + digest(self.call_facts)
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def inside(self, path: str) -> str:
        """`path` inside the checked project (forward slashes), as given when outside it."""
        path = path.replace("\\", "/")
        root = self.root.replace("\\", "/").rstrip("/")
        if not root:
            return path
        for candidate in (path, os.path.realpath(path).replace("\\", "/")):
            if candidate.startswith(root + "/"):
                return candidate[len(root) + 1 :]
        return path

    def is_module_class_name(self, name: str) -> bool:
        return name.rsplit(".", 1)[-1] in self.module_classes or _base_is_torch_module(name)


def _digest_text(text: str) -> str:
    return hashlib.sha1(text.encode()).hexdigest()[:16]


def digest(facts: dict[str, tuple[CallFact, ...]]) -> str:
    """A stable text digest of the facts (part of the cache fingerprint)."""
    lines = []
    for name in sorted(facts):
        for fact in facts[name]:
            lines.append(
                repr((name, fact.path, fact.target, fact.args, fact.keywords, fact.opaque))
            )
    return hashlib.sha1("\n".join(lines).encode()).hexdigest()[:16]
