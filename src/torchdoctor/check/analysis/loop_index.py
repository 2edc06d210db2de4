"""The functions and classes of one file, and which of its names hold models."""

from __future__ import annotations

import ast
import re
from collections.abc import Iterator
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.grad_contexts import is_autocast_call
from torchdoctor.check.analysis.names import (
    _EVALISH_PIECES,
    _MODELISH_PIECES,
    _NOT_MODEL,
    _VERB,
    _evalish_identifier,
    _lines_with,
    _modelish_word,
    is_modelish_name,
    is_torch_file,
)
from torchdoctor.check.analysis.syntax import dotted, last_part
from torchdoctor.check.analysis.wrapped import wrapped_functions
from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import Definition, definitions, walk

if TYPE_CHECKING:
    pass


# Hugging Face model classes: `...Model`, `...ForSequenceClassification`, `...LMHeadModel`
_HF_MODEL = re.compile(r"(?:Model|For[A-Z][A-Za-z]*)$")


# what follows the key in `_MODE_CALL` (grad_contexts): `.eval()`, `.train(False)`
_MODE_TAIL = re.compile(r"\.(eval\(\s*\)|train\(\s*(?:True|False|mode\s*=\s*\w+|\w*)\s*\))")
_KEY_START = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz_")


def mode_calls(source: str) -> Iterator[tuple[str, str]]:
    """(key, `eval()` / `train(...)`) of every match of `_MODE_CALL` in `source`, found
    from the `.eval(` / `.train(` needles: the regex, tried at every letter of the text,
    re-scans each dotted name once per letter. Its key is the run of word characters and
    dots before the needle, from the run's first ASCII letter or underscore."""
    for needle in (".eval(", ".train("):
        at = source.find(needle)
        while at >= 0:
            tail = _MODE_TAIL.match(source, at)
            if tail is not None:
                start = at
                while start and (source[start - 1].isalnum() or source[start - 1] in "_."):
                    start -= 1
                while start < at and source[start] not in _KEY_START:
                    start += 1
                if start < at:
                    yield source[start:at], tail.group(1)
            at = source.find(needle, at + 1)


class LoopIndex:
    """The functions of a file, indexed, and which names in it hold models."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.module = FunctionInfo(self, ctx.tree, "<module>", None, None)
        self.functions: list[FunctionInfo] = []  # every def, nested ones too
        self.top: dict[str, FunctionInfo] = {}  # module-level functions
        self.methods: dict[str, dict[str, FunctionInfo]] = {}  # class -> name -> function
        self.classes: dict[str, ast.ClassDef] = {}
        self._index(ctx.shared("tree_walk.definitions", lambda c: definitions(c.tree.body)))
        # `fast = typechecked(f)`: a call of the name runs `f`; not through a cache, whose
        # result may be a model an earlier caller switched to another mode
        for name, w in wrapped_functions(ctx).items():
            if not w.cached and w.function in self.top:
                self.top.setdefault(name, self.top[w.function])
        self._autocast_names: frozenset[str] | None = None
        self._mode_keys: frozenset[str] | None = None
        self._eval_keys: frozenset[str] = frozenset()
        self._model_keys: dict[str, bool] = {}
        self._module_models: frozenset[str] | None = None
        self._model_roots: frozenset[str] | None = None
        self._evaluation_words: list[str] | None = None
        self._model_words: list[str] | None = None
        self._evaluation_lines: list[int] | None = None
        self._model_lines: list[int] | None = None
        self._sensitive: dict[str, bool | None] = {}

    def _index(self, found: list[tuple[Definition, Definition | None]]) -> None:
        """Functions (nested ones under their parent, methods under their class) and
        the module-level classes, from `tree_walk.definitions`."""
        infos: dict[ast.AST, FunctionInfo] = {}
        for node, owner in found:
            if node.__class__ is ast.ClassDef:
                assert isinstance(node, ast.ClassDef)
                if owner is None:
                    self.classes.setdefault(node.name, node)
                continue
            assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            cls = owner if isinstance(owner, ast.ClassDef) else None
            parent = infos.get(owner) if owner is not None and cls is None else None
            info = infos[node] = FunctionInfo(self, node, node.name, cls, parent)
            self.functions.append(info)
            if parent is not None:
                parent.nested.setdefault(node.name, info)
            elif cls is not None:
                self.methods.setdefault(cls.name, {}).setdefault(node.name, info)
            else:
                self.top.setdefault(node.name, info)

    def all_functions(self) -> list[FunctionInfo]:
        return [self.module, *self.functions]

    def function_of(self, node: ast.AST) -> FunctionInfo | None:
        for fi in self.functions:
            if fi.node is node:
                return fi
        return None

    # -- file-wide name facts ------------------------------------------------------
    # -- where words occur (one scan of the source per kind of word) -----------------
    def words(self) -> frozenset[str]:
        """Every identifier of the file (one scan, shared by the word questions below)."""
        return self.ctx.words

    def evaluation_words(self) -> list[str]:
        """The eval-ish identifiers of the file, with `no_grad` / `inference_mode`."""
        if self._evaluation_words is None:
            found: list[str] = []
            if is_torch_file(self.ctx.source):
                found = [
                    w
                    for w in _lines_with(_EVALISH_PIECES, self.ctx.word_text)
                    if w in ("no_grad", "inference_mode") or _evalish_identifier(w)
                ]
            self._evaluation_words = found
        return self._evaluation_words

    def evaluation_lines(self) -> list[int]:
        """The lines holding an evaluation word (a function without one mentions none)."""
        if self._evaluation_lines is None:
            self._evaluation_lines = self.ctx.lines_naming(self.evaluation_words())
        return self._evaluation_lines

    def model_lines(self) -> list[int]:
        """The lines holding a model word or `self(`."""
        if self._model_lines is None:
            named = self.ctx.lines_naming(self.model_words())
            self._model_lines = sorted({*named, *self.ctx.lines_holding(["self("])})
        return self._model_lines

    def model_words(self) -> list[str]:
        """The identifiers of the file that may name a model."""
        if self._model_words is None:
            roots = self.model_roots()
            words = self.words()
            candidates = _lines_with(_MODELISH_PIECES, self.ctx.word_text)
            candidates |= words & {"G", "D"}
            self._model_words = [
                w for w in candidates if _modelish_word(w) and not self._other_class_name(w)
            ]
            self._model_words += [w for w in roots & words if w not in self._model_words]
        return self._model_words

    def _other_class_name(self, word: str) -> bool:
        """A CapWords name that cannot build a model: not a module class of the project,
        not imported from torchvision or timm (`torch.Generator`, `ModelConfig`)."""
        if not word[:1].isupper() or word.isupper():
            return False
        target = self.ctx.imports.get(word, "")
        return word not in self.ctx.project.module_classes and not target.startswith(
            ("torchvision", "timm")
        )

    def model_roots(self) -> frozenset[str]:
        """First names of every key set to eval/train mode, and module-level models."""
        if self._model_roots is None:
            roots = {k.split(".", 1)[0] for k in self.mode_keys()}
            roots |= {k.rsplit(".", 1)[-1] for k in self.mode_keys()}
            self._model_roots = frozenset(roots | self.module_models())
        return self._model_roots

    def module_models(self) -> frozenset[str]:
        """Module-level names bound to a model (`model = Net()` at the top of a script)."""
        if self._module_models is None:
            found = set()
            for stmt in self.module.body:
                if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                    key = dotted(stmt.targets[0])
                    if key and "." not in key and self.is_model_key(key):
                        found.add(key)
            self._module_models = frozenset(found)
        return self._module_models

    def mode_keys(self) -> frozenset[str]:
        """Keys on which `.eval()` or `.train(...)` is called anywhere in the file."""
        if self._mode_keys is None:
            found: set[str] = set()
            evals: set[str] = set()
            for key, call in mode_calls(self.ctx.source):
                found.add(key)
                if not call.startswith("train(") or "False" in call:
                    evals.add(key)
            self._mode_keys = frozenset(found)
            self._eval_keys = frozenset(evals)
        return self._mode_keys

    def ever_set_to_eval(self, key: str) -> bool:
        """`key.eval()` (or on its root) somewhere in the file: its mode is managed."""
        self.mode_keys()
        root = key.split(".", 1)[0]
        return any(k in (key, root) or k.startswith(root + ".") for k in self._eval_keys)

    def optimized(self, key: str) -> bool:
        """Whether `key.parameters()` (or its root's) appears: an optimizer may train it."""
        src = self.ctx.source
        root = key.split(".", 1)[0]
        return (
            f"{key}.parameters(" in src
            or f"{root}.parameters(" in src
            or (f"{key}.named_parameters(" in src)
        )

    def autocast_names(self) -> frozenset[str]:
        """Names assigned an autocast context (`ctx = nullcontext() if cpu else autocast(...)`)."""
        if self._autocast_names is None:
            found: set[str] = set()
            if "autocast" in self.ctx.source:
                for fi in self.all_functions():
                    if "autocast" not in fi.text:
                        continue
                    for stmt in fi.own_statements():
                        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
                            key = dotted(stmt.targets[0])
                            if key and any(
                                isinstance(n, ast.Call) and is_autocast_call(self.ctx, n)
                                for n in walk(stmt.value)
                            ):
                                found.add(key)
            self._autocast_names = frozenset(found)
        return self._autocast_names

    def is_model_key(self, key: str) -> bool:
        """Whether `key` names a model object (not a class, a function or a module)."""
        found = self._model_keys.get(key)
        if found is None:
            found = self._is_model_key(key)
            self._model_keys[key] = found
        return found

    def _is_model_key(self, key: str) -> bool:
        parts = key.split(".")
        if any(_NOT_MODEL.search(p) for p in parts) or parts[0] in self.ctx.imports:
            return False
        if len(parts) == 1 and (parts[0] in self.top or parts[0] in self.classes):
            return False
        last = parts[-1]
        if (last[:1].isupper() and not last.isupper()) or _VERB.match(last):
            return False  # a class (`LinearClassifier`), a builder (`get_model`, `forward_encoder`)
        return key in self.mode_keys() or is_modelish_name(key)

    def is_module_constructor(self, call: ast.Call) -> bool:
        """`Net(...)` of a project nn.Module class, torchvision/timm model builders."""
        name = self.ctx.qualname(call.func)
        if name is None:
            return False
        if name.startswith(("torchvision.models.", "timm.create_model", "timm.models.")):
            return True
        if name in ("torch.nn.Sequential", "torch.nn.ModuleList", "torch.nn.ModuleDict"):
            return True
        last = last_part(name)
        if last.endswith("Loss") or name.startswith("torch.") or not last[:1].isupper():
            return False
        if name.startswith("transformers.") and _HF_MODEL.search(last):
            return True  # `BertForSequenceClassification(config)` (from_pretrained() is eval)
        return last in self.ctx.project.module_classes
