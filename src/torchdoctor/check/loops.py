"""Training-loop structure shared by the training-loop rules (TD2xx-TD6xx).

What lives here (per-name dataflow -- which names are tensors, devices, batches --
is flow.py's job):

- the functions of a file, with calls resolved to functions of the same file and
  of sibling files imported from it (`from engine import evaluate`);
- *events*: the calls a training loop is made of -- `backward()`, optimizer and
  GradScaler steps, `zero_grad()`, clipping -- in program order, with the loops,
  branches (`if (i + 1) % accum == 0:`) and contexts (`no_grad`, `autocast`)
  around each;
- evaluation code: eval-named functions, loops over validation/test loaders,
  `no_grad`/`inference_mode` blocks and decorators (Lightning's
  `validation_step`/`test_step`/`predict_step` are excluded: Lightning sets
  eval mode and no_grad there itself);
- the train/eval *mode* of every model along every path, through calls
  ("the epoch loop calls `evaluate()`, which calls `model.eval()`").

Everything is computed lazily, once per file, and only for functions whose text
mentions what the asking rule needs.
"""

from __future__ import annotations

import ast
import contextlib
import functools
import os
import re
from collections import OrderedDict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

from torchdoctor.check.context import (
    IDENTIFIER,
    FileContext,
    child_fields,
    child_statements,
    walk,
)

FuncNode = ast.FunctionDef | ast.AsyncFunctionDef
LoopNode = ast.For | ast.AsyncFor | ast.While

# -- names -------------------------------------------------------------------------


def dotted(node: ast.AST) -> str | None:
    """`self.model` for a Name/Attribute chain (no alias resolution), else None."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    parts.append(node.id)
    return ".".join(reversed(parts))


def last_part(key: str) -> str:
    return key.rsplit(".", 1)[-1]


_WORD = re.compile(r"[A-Z]?[a-z]+|[A-Z]+(?![a-z])|\d+")


def words(text: str) -> list[str]:
    """`runValidation_epoch` -> ["run", "validation", "epoch"] (lowercase)."""
    return [w.lower() for w in _WORD.findall(text)]


EVAL_WORDS = frozenset(
    {
        "eval",
        "evaluate",
        "evaluation",
        "evaluator",
        "validate",
        "validation",
        "val",
        "valid",
        "test",
        "testing",
        "predict",
        "prediction",
        "inference",
        "infer",
        "generate",
    }
)
_GENERATION_WORDS = frozenset(
    {
        "generate",
        "text",
        "tokens",
        "sequence",
        "sequences",
        "samples",
        "images",
        "caption",
        "captions",
        "response",
        "responses",
        "answer",
        "output",
        "outputs",
        "and",
        "print",
        "sample",
        "simple",
        "batch",
        "greedy",
        "beam",
        "search",
    }
)
_EVAL_DATA_WORDS = frozenset({"val", "valid", "validation", "test", "testing", "eval", "dev"})
_NOT_EVAL_WORDS = frozenset(
    {
        "train",
        "training",
        "fit",
        "loss",
        "split",
        "set",
        "is",
        "get",
        "build",
        "make",
        "create",
        "loader",
        "dataloader",
        "dataset",
        "datasets",
        "transform",
        "transforms",
    }
)

# Lightning sets eval mode and no_grad around these itself.
_LIGHTNING_EVAL_HOOK = re.compile(
    r"^(?:(?:validation|valid|val|test|predict|inference|eval)_(?:step|step_end|epoch_end)"
    r"|on_(?:validation|test|predict)_\w+)$"
)


def is_lightning_eval_hook(name: str) -> bool:
    """`validation_step`, `test_step`, `predict_step` (Lightning), `valid_step` (fairseq)...:
    the framework sets eval mode and no_grad around these hooks itself."""
    return bool(_LIGHTNING_EVAL_HOOK.match(name))


def is_eval_name(name: str) -> bool:
    """evaluate, validate, run_validation, test_epoch, predict, generate -- not test_foo."""
    ws = words(name)
    if not ws or is_lightning_eval_hook(name):
        return False
    if any(w in _NOT_EVAL_WORDS for w in ws):
        return False
    if ws[0] == "test" and len(ws) > 1 and ws[1] not in ("epoch", "step", "loop", "one"):
        return False  # unit tests: test_conv_eval, testForward
    if "generate" in ws and not set(ws) <= _GENERATION_WORDS:
        return False  # generate_inputs, generate_config: not model inference
    return any(w in EVAL_WORDS for w in ws)


_TORCH_HINTS = ("torch", "lightning", "accelerate", ".backward(", ".eval()", "no_grad")


def is_torch_file(source: str) -> bool:
    """Code that may train or evaluate a PyTorch model (not the stdlib, not NumPy code)."""
    return any(hint in source for hint in _TORCH_HINTS)


# Pieces of identifiers that may be eval-ish / model-ish (lowercase): every word of
# EVAL_WORDS and _EVAL_DATA_WORDS contains one of the first, and every name _MODELISH
# matches (but G and D) one of the second -- a cheap prefilter, so the word tests run on
# few names
_EVALISH_PIECES = ("val", "test", "predict", "infer", "generate", "dev", "no_grad")
_MODELISH_PIECES = (
    "model",
    "net",
    "classifier",
    "coder",
    "generator",
    "discriminator",
    "critic",
    "actor",
    "backbone",
    "teacher",
    "student",
)


def _lines_with(pieces: tuple[str, ...], lines: str) -> set[str]:
    """The lines of `lines` (one identifier each) that contain one of `pieces` in any
    case: `str.find` on the lowered text, each hit widened to its line."""
    lowered = lines.lower()
    if len(lowered) != len(lines):  # a non-ASCII letter whose lower case is longer
        return {w for w in lines.split("\n") if any(p in w.lower() for p in pieces)}
    found: set[str] = set()
    for piece in pieces:
        at = lowered.find(piece)
        while at >= 0:
            start = lowered.rfind("\n", 0, at) + 1
            end = lowered.find("\n", at)
            if end < 0:
                end = len(lowered)
            found.add(lines[start:end])
            at = lowered.find(piece, end)
    return found


_EVALISH: dict[str, bool] = {}
_MODELISH_WORDS: dict[str, bool] = {}


def _modelish_word(word: str) -> bool:
    found = _MODELISH_WORDS.get(word)
    if found is None:
        found = is_modelish_name(word)
        if len(_MODELISH_WORDS) < 100_000:
            _MODELISH_WORDS[word] = found
    return found


def _evalish_identifier(name: str) -> bool:
    found = _EVALISH.get(name)
    if found is None:
        found = is_eval_name(name) or is_eval_iterable(name)
        if len(_EVALISH) < 100_000:
            _EVALISH[name] = found
    return found


def is_test_file(path: str) -> bool:
    """Unit tests (`test_x.py`, `x_test.py`, `conftest.py`): not training code."""
    base = path.replace("\\", "/").rsplit("/", 1)[-1]
    return base.startswith("test_") or base.endswith("_test.py") or base == "conftest.py"


def is_eval_iterable(text: str) -> bool:
    """`val_loader`, `tqdm(test_dataloader)`, `data_loader_val` -- not `train_loader`."""
    ws = words(text)
    return any(w in _EVAL_DATA_WORDS for w in ws) and not any(
        w in ("train", "training") for w in ws
    )


_MODELISH = re.compile(
    # single letters only as GAN code spells them (G, D): `d` and `g` are dicts and graphs
    r"^(?:(?-i:[GD])|net[A-Z_]\w*|model_\w+|\w*model|\w*net|network|classifier|encoder"
    r"|decoder|generator|discriminator|critic|actor|backbone|teacher|student)$",
    re.I,
)
_NOT_A_MODEL_PREFIX = re.compile(r"^(?:d|n|num|dim|size|len|is|has|use|max|min)_", re.I)
_NOT_MODEL = re.compile(r"loss|criterion|metric|optim|sched|scaler|accelerator|fabric", re.I)


def is_modelish_name(key: str) -> bool:
    """`model`, `net`, `resnet`, `policy_net`, `netG`, `self.encoder` -- not `writer.generator`."""
    parts = key.split(".")
    if len(parts) > 1 and parts[0] != "self" and not _MODELISH.match(parts[0]):
        return False
    last = parts[-1]
    if _NOT_A_MODEL_PREFIX.match(last):
        return False  # d_model, num_models, use_model: sizes and flags
    return bool(_MODELISH.match(last)) and not _NOT_MODEL.search(last)


_VERB = re.compile(
    r"(?:get|build|create|make|load|unwrap|init|setup|prepare|forward|run|compute|to|from|"
    r"convert|export|wrap|apply|update|set|reset|register|fuse|save|train|eval)(?:_|$)",
    re.I,
)
_OPTIMIZERISH = re.compile(r"optim|^opt(?:$|[_A-Z0-9])|_opt(?:$|[_A-Z0-9])", re.I)


def is_optimizerish(key: str) -> bool:
    last = last_part(key)
    return bool(_OPTIMIZERISH.search(last)) and "sched" not in last.lower()


def is_scalerish(key: str) -> bool:
    return "scaler" in last_part(key).lower()


# -- what calls mean -----------------------------------------------------------------

_NO_GRAD_CALLS = frozenset(
    {
        "torch.no_grad",
        "torch.inference_mode",
        "torch.autograd.no_grad",
        "torch.autograd.inference_mode",
        "torch.autograd.grad_mode.no_grad",
        "torch.autograd.grad_mode.inference_mode",
    }
)
_GRAD_SWITCH_CALLS = frozenset(
    {"torch.set_grad_enabled", "torch.autograd.set_grad_enabled", "torch.enable_grad"}
)
_AUTOCAST_CALLS = frozenset(
    {
        "torch.autocast",
        "torch.amp.autocast",
        "torch.cuda.amp.autocast",
        "torch.cpu.amp.autocast",
        "torch.amp.autocast_mode.autocast",
        "torch.xpu.amp.autocast",
    }
)
_WRAPPERS = frozenset(
    {
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
        "torch.compile",
    }
)
# Methods that return the same module (or a wrapper in the same mode).
_SAME_MODULE_METHODS = frozenset(
    {
        "to",
        "cuda",
        "cpu",
        "half",
        "float",
        "double",
        "bfloat16",
        "type",
        "share_memory",
        "requires_grad_",
        "to_empty",
        "xpu",
        "mps",
    }
)
# Methods of a module that never change its train/eval mode.
_MODE_SAFE_METHODS = _SAME_MODULE_METHODS | frozenset(
    {
        "forward",
        "parameters",
        "named_parameters",
        "buffers",
        "named_buffers",
        "modules",
        "named_modules",
        "children",
        "named_children",
        "state_dict",
        "load_state_dict",
        "zero_grad",
        "register_buffer",
        "register_parameter",
        "register_forward_hook",
        "register_forward_pre_hook",
        "register_full_backward_hook",
        "get_submodule",
        "get_parameter",
        "extra_repr",
        "generate",
        "get_input_embeddings",
        "get_output_embeddings",
        "no_sync",
        "save_pretrained",
    }
)
# Functions that take a model and leave its mode alone.
_MODE_SAFE_FUNCTIONS = frozenset(
    {
        "print",
        "len",
        "isinstance",
        "id",
        "str",
        "repr",
        "type",
        "hasattr",
        "getattr",
        "setattr",
        "torch.save",
        "copy.deepcopy",
        "sum",
        "list",
        "vars",
        "torch.nn.utils.clip_grad_norm_",
        "torch.nn.utils.clip_grad_value_",
    }
)

_MODE_CALL = re.compile(
    r"([A-Za-z_][\w.]*)\.(eval\(\s*\)|train\(\s*(?:True|False|mode\s*=\s*\w+|\w*)\s*\))"
)
# What makes train and eval mode differ: Dropout, BatchNorm, code reading `self.training`.
_MODE_SENSITIVE = re.compile(
    r"[Dd]ropout|[Bb]atch_?[Nn]orm|\btraining\b|Transformer|[Dd]rop_?[Pp]ath|InstanceNorm"
    r"|RReLU|drop_rate|[Ss]tochastic[Dd]epth"
)
_MISSING = object()
_ZEROING = re.compile(
    r"zero_grad|\.grad\s*=\s*None|\.grad(?:\.data)?\.(?:zero_|fill_|mul_|detach_)|"
    r"_foreach_zero_|set_to_none|del\s+\S+\.grad\b"
)


def mentions_zeroing(text: str) -> bool:
    return bool(_ZEROING.search(text))


def decorator_names(ctx: FileContext, node: FuncNode) -> list[str]:
    names = []
    for dec in node.decorator_list:
        target = dec.func if isinstance(dec, ast.Call) else dec
        name = ctx.qualname(target)
        if name:
            names.append(name)
    return names


def is_no_grad_decorated(ctx: FileContext, node: FuncNode) -> bool:
    """`@torch.no_grad()`, `@torch.inference_mode()`, `@smart_inference_mode()`..."""
    return any(
        "no_grad" in last_part(n) or "inference_mode" in last_part(n)
        for n in decorator_names(ctx, node)
    )


@dataclass(frozen=True)
class GradContext:
    """What a `with` item does to autograd and autocast."""

    no_grad: bool = False  # no_grad / inference_mode / set_grad_enabled(False)
    grad_switch: bool = False  # set_grad_enabled(expr) / enable_grad: grads deliberately managed
    autocast: bool = False
    autocast_off: bool = False  # autocast(enabled=False): full precision inside


def with_item_context(
    ctx: FileContext, expr: ast.expr, autocast_names: frozenset[str]
) -> GradContext:
    if isinstance(expr, ast.Call):
        name = ctx.qualname(expr.func) or ""
        if name in _NO_GRAD_CALLS or name in ("no_grad", "inference_mode"):
            return GradContext(no_grad=True)
        if name in _GRAD_SWITCH_CALLS or name in ("set_grad_enabled", "enable_grad"):
            if (
                name.endswith("set_grad_enabled")
                and expr.args
                and isinstance(expr.args[0], ast.Constant)
                and expr.args[0].value is False
            ):
                return GradContext(no_grad=True)
            return GradContext(grad_switch=True)
        if is_autocast_call(ctx, expr):
            return GradContext(autocast=True)
        if (ctx.qualname(expr.func) or "").endswith("autocast"):
            return GradContext(autocast_off=True)
        return GradContext()
    key = dotted(expr)
    if key is not None and key in autocast_names:
        return GradContext(autocast=True)
    return GradContext()


def is_autocast_call(ctx: FileContext, call: ast.Call) -> bool:
    name = ctx.qualname(call.func) or ""
    if not (
        name in _AUTOCAST_CALLS
        or name == "autocast"
        or name.endswith((".amp.autocast", "accelerator.autocast", "fabric.autocast"))
    ):
        return False
    for kw in call.keywords:
        if kw.arg == "enabled" and isinstance(kw.value, ast.Constant) and not kw.value.value:
            return False
    return True


def post_order_calls(node: ast.AST) -> list[ast.Call]:
    """Calls inside `node` in evaluation order (inner calls before the call using them).

    Does not enter nested function/class definitions or lambdas.
    """
    out: list[ast.Call] = []
    _post_order(node, child_fields(want_operators=False), _skipped_by_post_order(), out)
    return out


def _post_order(
    n: ast.AST, table: dict[type, tuple[str, ...]], skip: frozenset[type], out: list[ast.Call]
) -> None:
    # a module-level function: a closure calling itself is a reference cycle, left to the
    # cyclic garbage collector on every call
    for name in table.get(n.__class__, n._fields):
        value = getattr(n, name, None)
        if value.__class__ is list:
            for child in value:
                if child.__class__ not in skip and isinstance(child, ast.AST):
                    _post_order(child, table, skip, out)
        elif value.__class__ not in skip and isinstance(value, ast.AST):
            _post_order(value, table, skip, out)
    if n.__class__ is ast.Call:
        out.append(n)  # type: ignore[arg-type]


@functools.cache
def _skipped_by_post_order() -> frozenset[type]:
    """Definitions and lambdas (not run here), and leaves (names, constants: no calls)."""
    leaves = {cls for cls, fields in child_fields(want_operators=False).items() if not fields}
    return frozenset(
        leaves | {ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef, ast.Lambda, type(None)}
    )


# -- events ---------------------------------------------------------------------------

BACKWARD = "backward"
STEP = "step"  # optimizer.step()
SCALER_STEP = "scaler_step"  # scaler.step(optimizer)
SCALER_UPDATE = "scaler_update"
UNSCALE = "unscale"
CLIP = "clip"
ZERO = "zero"  # optimizer.zero_grad(), model.zero_grad(), p.grad = None
CALL = "call"  # any other call (for resolution)


@dataclass(frozen=True)
class Branch:
    """One step down the statement tree: `node` entered through `label`."""

    node: ast.AST
    label: str  # body, orelse, finalbody, handlerN, caseN
    jumps: bool = False  # the block ends in return/raise/continue/break


@dataclass
class Event:
    kind: str
    node: ast.AST  # the call (or the `p.grad = None` statement)
    chain: tuple[Branch, ...]  # compound statements around it, outermost first
    subject: str | None = None  # optimizer / model / scaler key
    expr: ast.expr | None = None  # backward: the loss expression
    scaler: str | None = None  # backward of scaler.scale(loss): the scaler key
    target: str | None = None  # scaler.step(opt) / unscale_(opt): the optimizer key
    no_grad: bool = False
    autocast: ast.AST | None = None  # the innermost autocast `with`

    @property
    def line(self) -> int:
        return getattr(self.node, "lineno", 0)

    @property
    def order(self) -> tuple[int, int]:
        return (
            getattr(self.node, "end_lineno", 0) or 0,
            getattr(self.node, "end_col_offset", 0) or 0,
        )

    def loops(self) -> list[ast.AST]:
        return [b.node for b in self.chain if isinstance(b.node, LoopNode) and b.label == "body"]

    def in_loop(self, loop: ast.AST) -> bool:
        return any(b.node is loop and b.label == "body" for b in self.chain)

    def conditions_in(self, loop: ast.AST | None) -> list[ast.If]:
        """The `if` statements between `loop` (or the function) and this event."""
        inside = loop is None
        found: list[ast.If] = []
        for b in self.chain:
            if b.node is loop:
                inside = True
                continue
            if inside and isinstance(b.node, ast.If):
                found.append(b.node)
        return found

    def loops_in(self, loop: ast.AST) -> list[ast.AST]:
        """Loops nested inside `loop` that enclose this event."""
        inside = False
        found: list[ast.AST] = []
        for b in self.chain:
            if b.node is loop:
                inside = True
                continue
            if inside and isinstance(b.node, LoopNode) and b.label == "body":
                found.append(b.node)
        return found


def can_follow(a: Event, b: Event) -> bool:
    """Whether `b` can run after `a` in the same pass (no `if` between them, and no
    `continue`/`return` ending the block `a` is in before `b` is reached)."""
    if b.order <= a.order or not same_path(a, b):
        return False
    for i, branch in enumerate(a.chain):
        if branch.jumps and not (
            i < len(b.chain) and b.chain[i].node is branch.node and b.chain[i].label == branch.label
        ):
            return False
    return True


def same_path(a: Event, b: Event) -> bool:
    """Whether one run can execute both (not in two branches of one `if`/`match`/`try`)."""
    for x, y in zip(a.chain, b.chain, strict=False):
        if x.node is not y.node:
            return True
        if x.label != y.label:
            if isinstance(x.node, ast.If | ast.Match):
                return False
            if isinstance(x.node, ast.Try) or type(x.node).__name__ == "TryStar":
                # body then a handler, or body then else, or anything then finally
                return "body" in (x.label, y.label) or "finalbody" in (x.label, y.label)
            return True
    return True


def counter_condition(event: Event, loop: ast.AST) -> ast.BinOp | None:
    """The `x % k` of an `if (i + 1) % accum == 0:` between `loop` and `event`."""
    for cond in event.conditions_in(loop):
        found = modulo_test(cond.test)
        if found is not None:
            return found
    return None


def is_accumulation(events: list[Event], step: Event, loop: ast.AST) -> bool:
    """`step` runs every k passes of `loop` and consumes backward()s of every pass: a
    backward() runs on every pass, no step does, and the step's `if` has no backward of
    its own (GAN loops that update the generator every n_critic passes)."""
    if not any(e.kind == BACKWARD and unconditional_in(e, loop) for e in events):
        return False
    if any(e.kind in (STEP, SCALER_STEP) and unconditional_in(e, loop) for e in events):
        return False
    conditions = step.conditions_in(loop)
    own = conditions[0] if conditions else None
    return not any(
        e.kind == BACKWARD
        and e.order < step.order
        and own is not None
        and any(b.node is own for b in e.chain)
        for e in events
    )


def unconditional_in(event: Event, loop: ast.AST) -> bool:
    """Runs on every pass of `loop` (no `if` or inner loop in between)."""
    inside = False
    for b in event.chain:
        if b.node is loop:
            inside = True
            continue
        if inside and isinstance(b.node, ast.If | ast.Match | LoopNode | ast.Try):
            if isinstance(b.node, ast.Try) and b.label in ("body", "finalbody"):
                continue
            return False
    return inside


def innermost_common_loop(a: Event, b: Event) -> ast.AST | None:
    common = None
    for x, y in zip(a.chain, b.chain, strict=False):
        if x.node is not y.node or x.label != y.label:
            break
        if isinstance(x.node, LoopNode) and x.label == "body":
            common = x.node
    return common


def modulo_test(test: ast.expr) -> ast.BinOp | None:
    """The `x % k` inside `if (i + 1) % accum == 0:` (k not the literal 1)."""
    for node in walk(test):
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            right = node.right
            if isinstance(right, ast.Constant) and (
                not isinstance(right.value, int) or right.value <= 1
            ):
                continue
            if isinstance(node.left, ast.Constant) and isinstance(node.left.value, str):
                continue  # "%s" % x
            return node
    return None


# -- functions of a file ----------------------------------------------------------------


@dataclass(eq=False)
class FunctionInfo:
    """A function (or the module's top-level code) of an analysed file."""

    file: FileLoops
    node: FuncNode | ast.Module
    name: str
    cls: ast.ClassDef | None
    parent: FunctionInfo | None
    nested: dict[str, FunctionInfo] = field(default_factory=dict)
    _text: str | None = None
    _statements: list[ast.stmt] | None = None
    _locals: set[str] | None = None
    _evaluation: bool | None = None
    _model: bool | None = None
    _identifiers: frozenset[str] | None = None

    @property
    def mentions_evaluation(self) -> bool:
        """Whether an eval-ish name (`validate`, `val_loader`), `no_grad` or
        `inference_mode` occurs in this function: it may hold or call evaluation code."""
        if self._evaluation is None:
            words = self.file.evaluation_words()
            text = self.text
            # a substring test first (cheap), then whole identifiers: `val` is not `value`
            self._evaluation = any(w in text for w in words) and not self.identifiers().isdisjoint(
                words
            )
        return self._evaluation

    @property
    def mentions_model(self) -> bool:
        """Whether the code names something that may be a model (`model`, `self(...)`,
        a name set to eval/train mode or built from a module class in this file)."""
        if self._model is None:
            words = self.file.model_words()
            text = self.text
            self._model = "self(" in text or (
                any(w in text for w in words) and not self.identifiers().isdisjoint(words)
            )
        return self._model

    @property
    def is_module(self) -> bool:
        return isinstance(self.node, ast.Module)

    def identifiers(self) -> frozenset[str]:
        """Every identifier in this function's text (one regex scan, cached)."""
        if self._identifiers is None:
            self._identifiers = (
                self.file.words() if self.is_module else frozenset(IDENTIFIER.findall(self.text))
            )
        return self._identifiers

    @property
    def body(self) -> list[ast.stmt]:
        return self.node.body

    @property
    def label(self) -> str:
        if self.is_module:
            return "module level"
        prefix = f"{self.cls.name}." if self.cls is not None else ""
        return f"`{prefix}{self.name}()`"

    @property
    def text(self) -> str:
        if self._text is None:
            if self.is_module:
                self._text = self.file.ctx.source
            else:
                start, end = self.file.ctx.node_span(self.node)
                self._text = self.file.ctx.source[start:end]
        return self._text

    def params(self) -> list[str]:
        if isinstance(self.node, ast.Module):
            return []
        a = self.node.args
        names = [p.arg for p in (*a.posonlyargs, *a.args)]
        if (
            self.cls is not None
            and names
            and not any(
                isinstance(d, ast.Name) and d.id == "staticmethod" for d in self.node.decorator_list
            )
        ):
            names = names[1:]
        return names

    def keyword_params(self) -> list[str]:
        if isinstance(self.node, ast.Module):
            return []
        return [p.arg for p in self.node.args.kwonlyargs]

    def own_statements(self) -> list[ast.stmt]:
        """Every statement of this function in source order, not descending into nested
        defs/classes (which are listed themselves)."""
        if self._statements is None:
            found: list[ast.stmt] = []
            todo = list(reversed(self.body))
            while todo:
                stmt = todo.pop()
                found.append(stmt)
                if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                    continue
                todo.extend(reversed(child_statements(stmt)))
            self._statements = found
        return self._statements

    def local_names(self) -> set[str]:
        """Names bound in this function (parameters, assignments, loop targets)."""
        if self._locals is None:
            found = set(self.params()) | set(self.keyword_params())
            for stmt in self.own_statements():
                for target in _bound_targets(stmt):
                    for n in walk(target):
                        if isinstance(n, ast.Name):
                            found.add(n.id)
            self._locals = found
        return self._locals


def _bound_targets(stmt: ast.stmt) -> list[ast.expr]:
    if isinstance(stmt, ast.Assign):
        return list(stmt.targets)
    if isinstance(stmt, ast.AnnAssign | ast.AugAssign):
        return [stmt.target]
    if isinstance(stmt, ast.For | ast.AsyncFor):
        return [stmt.target]
    if isinstance(stmt, ast.With | ast.AsyncWith):
        return [i.optional_vars for i in stmt.items if i.optional_vars is not None]
    return []


class FileLoops:
    """The shared, lazily computed training-loop facts of one file."""

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx
        self.module = FunctionInfo(self, ctx.tree, "<module>", None, None)
        self.functions: list[FunctionInfo] = []  # every def, nested ones too
        self.top: dict[str, FunctionInfo] = {}  # module-level functions
        self.methods: dict[str, dict[str, FunctionInfo]] = {}  # class -> name -> function
        self.classes: dict[str, ast.ClassDef] = {}
        self._index(ctx.tree.body, None, None)
        self._events: dict[int, list[Event]] = {}
        self._modes: dict[int, ModeResult] = {}
        self._summaries: dict[int, Summary | None] = {}
        self._autocast_names: frozenset[str] | None = None
        self._mode_keys: frozenset[str] | None = None
        self._eval_keys: frozenset[str] = frozenset()
        self._model_keys: dict[str, bool] = {}
        self._module_models: frozenset[str] | None = None
        self._model_roots: frozenset[str] | None = None
        self._evaluation_words: list[str] | None = None
        self._model_words: list[str] | None = None
        self._sensitive: dict[str, bool | None] = {}

    def _index(
        self, stmts: list[ast.stmt], cls: ast.ClassDef | None, parent: FunctionInfo | None
    ) -> None:
        todo = list(reversed(stmts))  # a stack: statements come off in source order
        while todo:
            stmt = todo.pop()
            if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
                info = FunctionInfo(self, stmt, stmt.name, cls, parent)
                self.functions.append(info)
                if parent is not None:
                    parent.nested.setdefault(stmt.name, info)
                elif cls is not None:
                    self.methods.setdefault(cls.name, {}).setdefault(stmt.name, info)
                else:
                    self.top.setdefault(stmt.name, info)
                self._index(stmt.body, None, info)
            elif isinstance(stmt, ast.ClassDef):
                if parent is None and cls is None:
                    self.classes.setdefault(stmt.name, stmt)
                self._index(stmt.body, stmt, None)
            else:
                todo.extend(reversed(child_statements(stmt)))

    def release(self) -> None:
        """Break the cycles (each function refers to this file, callers to callees,
        summaries to their file) so that reference counting frees the syntax tree."""
        for fi in (self.module, *self.functions):
            vars(fi).clear()
        vars(self).clear()
        while _EVICTED:
            sibling = _EVICTED.pop()
            if sibling is not self:
                sibling.ctx.close()
                sibling.release()

    def all_functions(self) -> list[FunctionInfo]:
        return [self.module, *self.functions]

    def callers(self, fi: FunctionInfo) -> list[tuple[FunctionInfo, Event]]:
        """The calls of `fi` in this file, with the function each is in."""
        found: list[tuple[FunctionInfo, Event]] = []
        if fi.is_module or fi.file is not self:
            return found
        needle = fi.name + "("
        for other in self.all_functions():
            if needle not in other.text:
                continue
            for event in self.events(other):
                call = event.node
                if event.kind != CALL or not isinstance(call, ast.Call):
                    continue
                func = call.func
                name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", "")
                if name != fi.name:
                    continue
                resolved = self.resolve(other, call, other_files=False)
                if resolved is not None and resolved[0] is fi:
                    found.append((other, event))
        return found

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
                    for w in _lines_with(_EVALISH_PIECES, "\n".join(self.words()))
                    if w in ("no_grad", "inference_mode") or _evalish_identifier(w)
                ]
            self._evaluation_words = found
        return self._evaluation_words

    def model_words(self) -> list[str]:
        """The identifiers of the file that may name a model."""
        if self._model_words is None:
            roots = self.model_roots()
            words = self.words()
            candidates = _lines_with(_MODELISH_PIECES, "\n".join(words))
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
            src = self.ctx.source
            if ".eval(" in src or ".train(" in src:
                for m in _MODE_CALL.finditer(src):
                    found.add(m.group(1))
                    if not m.group(2).startswith("train(") or "False" in m.group(2):
                        evals.add(m.group(1))
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
        return last in self.ctx.project.module_classes

    # -- does train/eval mode change what a model computes? --------------------------
    def class_mode_sensitive(self, name: str, _depth: int = 0) -> bool | None:
        """True: class `name` has Dropout/BatchNorm/...; False: provably none; None: unknown."""
        found = self._sensitive.get(name, _MISSING)
        if found is not _MISSING:
            return found  # type: ignore[return-value]
        self._sensitive[name] = None  # recursion guard
        result = self._class_sensitive(name, _depth)
        self._sensitive[name] = result
        return result

    def _class_sensitive(self, name: str, depth: int) -> bool | None:
        cls = self.classes.get(name)
        owner: FileLoops = self
        if cls is None:
            target = self.ctx.imports.get(name)
            if target and "." in target.lstrip(".") and depth < 2:
                module, _, cname = target.rpartition(".")
                other = sibling_file(self.ctx, module)
                if other is not None and cname in other.classes:
                    return other.class_mode_sensitive(cname, depth + 1)
            return None
        text = owner.ctx.segment(cls)
        if _MODE_SENSITIVE.search(text):
            return True
        verdict: bool | None = False
        for base in cls.bases:
            bname = owner.ctx.qualname(base) or ""
            if bname.startswith("torch.") or bname in ("object", "Module"):
                continue
            sub = owner.class_mode_sensitive(last_part(bname), depth + 1)
            if sub:
                return True
            if sub is None:
                verdict = None
        for node in walk(cls):
            if not isinstance(node, ast.Call):
                continue
            cname = owner.ctx.qualname(node.func) or ""
            last = last_part(cname)
            if cname.startswith("torch.") or not last[:1].isupper() or last == name:
                continue
            sub = owner.class_mode_sensitive(last, depth + 1)
            if sub:
                return True
            if sub is None and (
                last in owner.ctx.project.module_classes or last not in owner.classes
            ):
                verdict = None  # an imported or unseen layer: it may have Dropout
        for node in walk(cls):
            # self.backbone = resnet18(): a module from a factory we cannot see
            if (
                isinstance(node, ast.Assign)
                and isinstance(node.value, ast.Call)
                and any(isinstance(t, ast.Attribute) for t in node.targets)
            ):
                cname = owner.ctx.qualname(node.value.func) or ""
                if not cname.startswith(("torch.", "self.")) and not last_part(cname)[:1].isupper():
                    verdict = None
        return verdict

    def key_mode_sensitive(self, key: str) -> bool | None:
        """Same question for a variable, from every `key = Class(...)` in the file."""
        assignment = re.compile(r"(?m)^[ \t]*" + re.escape(key) + r"[ \t]*=(?!=)[ \t]*(.*)$")
        classes = set()
        plain_layers = False
        for m in assignment.finditer(self.ctx.source):
            call = re.match(r"([\w.]+)\(", m.group(1))
            if call is None:
                return None  # assigned from something we cannot follow
            name = last_part(call.group(1))
            if name in ("DataParallel", "DistributedDataParallel", "DDP", "compile", "to"):
                continue
            head, _, rest = call.group(1).partition(".")
            qual = self.ctx.imports.get(head, head) + ("." + rest if rest else "")
            if qual.startswith("torch.nn.") and name not in (
                "Sequential",
                "ModuleList",
                "ModuleDict",
            ):
                if _MODE_SENSITIVE.search(m.group(1)):
                    return True  # nn.Dropout(...), nn.LSTM(..., dropout=0.5)
                plain_layers = True
                continue  # nn.Linear, nn.Conv2d, nn.LSTM: the same in both modes
            if not name[:1].isupper():
                return None  # a factory: get_model(...), resnet18(...)
            classes.add(name)
        if not classes:
            return False if plain_layers else None
        verdicts = [self.class_mode_sensitive(c) for c in classes]
        if any(verdicts):
            return True
        return None if None in verdicts else False

    # -- resolution ----------------------------------------------------------------
    def resolve(
        self, fi: FunctionInfo, call: ast.Call, *, other_files: bool = True
    ) -> tuple[FunctionInfo, bool] | None:
        """The function `call` runs, and whether it is called as a method on `self`.

        With `other_files`, names imported from a sibling module are looked up there
        (which parses that file once); otherwise only this file is searched.
        """
        func = call.func
        if isinstance(func, ast.Name):
            scope: FunctionInfo | None = fi
            while scope is not None:
                if func.id in scope.nested:
                    return scope.nested[func.id], False
                scope = scope.parent
            if func.id in self.top:
                return self.top[func.id], False
            target = self.ctx.imports.get(func.id)
            # CapWords names are classes: constructing one runs no code we summarise
            if other_files and target and "." in target.lstrip(".") and func.id[:1].islower():
                module, _, name = target.rpartition(".")
                other = sibling_file(self.ctx, module)
                if other is not None and name in other.top:
                    return other.top[name], False
            return None
        if isinstance(func, ast.Attribute) and isinstance(func.value, ast.Name):
            owner = func.value.id
            if owner == "self":
                scope = fi
                while scope is not None and scope.cls is None:
                    scope = scope.parent
                if scope is not None and scope.cls is not None:
                    method = self.methods.get(scope.cls.name, {}).get(func.attr)
                    if method is not None:
                        return method, True
                return None
            target = self.ctx.imports.get(owner)
            if other_files and target is not None and func.attr[:1].islower():
                other = sibling_file(self.ctx, target)
                if other is not None and func.attr in other.top:
                    return other.top[func.attr], False
        return None

    # -- lazily computed per function -------------------------------------------------
    def events(self, fi: FunctionInfo) -> list[Event]:
        cached = self._events.get(id(fi))
        if cached is None:
            cached = _EventCollector(self, fi).run()
            self._events[id(fi)] = cached
        return cached

    def modes(self, fi: FunctionInfo) -> ModeResult:
        cached = self._modes.get(id(fi))
        if cached is None:
            cached = ModeInterpreter(self, fi, entry=not fi.is_module).run()
            self._modes[id(fi)] = cached
        return cached

    def summary(self, fi: FunctionInfo) -> Summary | None:
        """What calling `fi` does to its arguments' modes; None while being computed."""
        key = id(fi)
        if key in self._summaries:
            return self._summaries[key]
        self._summaries[key] = None  # recursion guard
        result = self.modes(fi).summary()
        self._summaries[key] = result
        return result


# -- sibling files ---------------------------------------------------------------------

_SIBLINGS: OrderedDict[tuple[str, int, int], FileLoops | None] = OrderedDict()
_SIBLING_LIMIT = 64
# Siblings dropped from the cache while a file is checked: the analysis in progress may
# still be using them, so they are released (their cycles broken) with that file.
_EVICTED: list[FileLoops] = []
_MAX_SIBLING_BYTES = 400_000


# Files read as siblings while checking one file: the results cache keys on them too
# (see `recording_siblings`); a stack, because nothing stops a caller from nesting.
_READING: list[set[str]] = []


@contextlib.contextmanager
def recording_siblings() -> Iterator[set[str]]:
    """Collect the paths of the sibling files analysed inside the `with` block."""
    found: set[str] = set()
    _READING.append(found)
    try:
        yield found
    finally:
        _READING.pop()


def sibling_file(ctx: FileContext, module: str) -> FileLoops | None:
    """The analysed file a dotted import names, looked up beside the checked file."""
    level = len(module) - len(module.lstrip("."))
    parts = [p for p in module.lstrip(".").split(".") if p]
    if not parts or ctx.path in ("", "<stdin>"):
        return None
    base = os.path.dirname(os.path.abspath(ctx.path))
    bases = []
    if level:
        for _ in range(level - 1):
            base = os.path.dirname(base)
        bases.append(base)
    else:
        for _ in range(3):  # the script's folder and the package roots above it
            bases.append(base)
            base = os.path.dirname(base)
    for root in bases:
        stem = os.path.join(root, *parts)
        for candidate in (stem + ".py", os.path.join(stem, "__init__.py")):
            if os.path.isfile(candidate):
                if os.path.abspath(candidate) == os.path.abspath(ctx.path):
                    return None
                for reading in _READING:
                    reading.add(os.path.abspath(candidate))
                return _load_sibling(candidate, ctx)
    return None


def _load_sibling(path: str, ctx: FileContext) -> FileLoops | None:
    try:
        st = os.stat(path)
    except OSError:
        return None
    key = (path, st.st_mtime_ns, st.st_size)
    if key in _SIBLINGS:
        _SIBLINGS.move_to_end(key)
        return _SIBLINGS[key]
    result: FileLoops | None = None
    if st.st_size <= _MAX_SIBLING_BYTES:
        try:
            with open(path, "rb") as handle:
                data = handle.read()
            from torchdoctor.check.engine import decode_source

            source = decode_source(data)
            tree = ast.parse(source, filename=path)
            result = FileLoops(FileContext(path, source, tree, ctx.project))
        except (OSError, SyntaxError, ValueError, UnicodeDecodeError, LookupError):
            result = None
    _SIBLINGS[key] = result
    if len(_SIBLINGS) > _SIBLING_LIMIT:
        evicted = _SIBLINGS.popitem(last=False)[1]
        if evicted is not None:
            _EVICTED.append(evicted)
    return result


def analysis(ctx: FileContext) -> FileLoops:
    """The shared training-loop facts of the file being checked (computed once, kept
    on the context so they go with it)."""
    return ctx.shared("loops", FileLoops)


# -- event collection ----------------------------------------------------------------------


def classify_call(ctx: FileContext, call: ast.Call) -> tuple[str, dict[str, object]]:
    """(kind, details) of a call that matters to training loops; kind CALL otherwise."""
    func = call.func
    if isinstance(func, ast.Attribute):
        attr = func.attr
        owner = dotted(func.value)
        if attr == "backward":
            if len(call.args) > 1:
                return CALL, {}  # Function.backward(ctx, grad): a definition's helper
            if owner is not None and (
                (last_part(owner) in ("accelerator", "fabric", "self") and call.args)
                or owner.endswith(("accelerator", "fabric"))
            ):
                return BACKWARD, {"expr": call.args[0] if call.args else None, "subject": owner}
            if owner == "torch.autograd" and call.args:
                return BACKWARD, {"expr": call.args[0]}
            if call.args and owner is not None and not call.keywords:
                # engine.backward(loss) (DeepSpeed-style) -- still a backward of that loss
                return BACKWARD, {"expr": call.args[0], "subject": owner}
            loss = func.value
            scaler = None
            if (
                isinstance(loss, ast.Call)
                and isinstance(loss.func, ast.Attribute)
                and loss.func.attr == "scale"
                and len(loss.args) == 1
            ):
                scaler = dotted(loss.func.value)
                loss = loss.args[0]
            return BACKWARD, {"expr": loss, "scaler": scaler}
        if attr == "manual_backward" and call.args:
            return BACKWARD, {"expr": call.args[0]}
        if attr == "zero_grad":
            return ZERO, {"subject": owner}
        if owner is not None and attr == "zero_" and owner.endswith((".grad", ".grad.data")):
            return ZERO, {"subject": None}
        if attr == "step" and owner is not None:
            if is_scalerish(owner) and call.args:
                return SCALER_STEP, {"subject": owner, "target": dotted(call.args[0])}
            if is_optimizerish(owner) and len(call.args) <= 1:
                return STEP, {"subject": owner}
            return CALL, {}
        if attr == "update" and owner is not None and is_scalerish(owner) and not call.args:
            return SCALER_UPDATE, {"subject": owner}
        if attr == "unscale_" and owner is not None:
            return UNSCALE, {
                "subject": owner,
                "target": dotted(call.args[0]) if call.args else None,
            }
        if attr in ("clip_grad_norm_", "clip_grad_value_"):
            if owner is not None and last_part(owner) in ("accelerator", "fabric"):
                return CALL, {}  # these unscale first themselves
            return CLIP, {}
    else:
        name = ctx.qualname(func) or ""
        if name in ("torch.autograd.backward", "backward") and call.args:
            return BACKWARD, {"expr": call.args[0]}
        if name.endswith(
            ("clip_grad_norm_", "clip_grad_value_", "clip_grad_norm", "dispatch_clip_grad")
        ):
            return CLIP, {}
    return CALL, {}


class _EventCollector:
    """One syntactic pass over a function collecting events with their context."""

    def __init__(self, fl: FileLoops, fi: FunctionInfo) -> None:
        self.fl = fl
        self.ctx = fl.ctx
        self.fi = fi
        self.events: list[Event] = []
        self.autocast_names = fl.autocast_names()

    def run(self) -> list[Event]:
        no_grad = not self.fi.is_module and is_no_grad_decorated(self.ctx, self.fi.node)  # type: ignore[arg-type]
        self._block(self.fi.body, (), no_grad, None)
        self.events.sort(key=lambda e: e.order)
        return self.events

    def _block(
        self,
        stmts: list[ast.stmt],
        chain: tuple[Branch, ...],
        no_grad: bool,
        autocast: ast.AST | None,
    ) -> None:
        if (
            chain
            and not isinstance(chain[-1].node, LoopNode)
            and any(isinstance(s, _JUMPS) for s in stmts)
        ):
            last = chain[-1]
            chain = (*chain[:-1], Branch(last.node, last.label, True))
        for stmt in stmts:
            self._stmt(stmt, chain, no_grad, autocast)

    def _exprs(
        self,
        nodes: Iterable[ast.AST | None],
        chain: tuple[Branch, ...],
        no_grad: bool,
        autocast: ast.AST | None,
    ) -> None:
        for node in nodes:
            if node is None:
                continue
            for call in post_order_calls(node):
                kind, info = classify_call(self.ctx, call)
                self.events.append(
                    Event(
                        kind,
                        call,
                        chain,
                        subject=info.get("subject"),  # type: ignore[arg-type]
                        expr=info.get("expr"),  # type: ignore[arg-type]
                        scaler=info.get("scaler"),  # type: ignore[arg-type]
                        target=info.get("target"),  # type: ignore[arg-type]
                        no_grad=no_grad,
                        autocast=autocast,
                    )
                )

    def _stmt(
        self, stmt: ast.stmt, chain: tuple[Branch, ...], no_grad: bool, autocast: ast.AST | None
    ) -> None:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return
        if isinstance(stmt, ast.If):
            self._exprs([stmt.test], chain, no_grad, autocast)
            self._block(stmt.body, (*chain, Branch(stmt, "body")), no_grad, autocast)
            self._block(stmt.orelse, (*chain, Branch(stmt, "orelse")), no_grad, autocast)
        elif isinstance(stmt, ast.For | ast.AsyncFor):
            self._exprs([stmt.iter], chain, no_grad, autocast)
            self._block(stmt.body, (*chain, Branch(stmt, "body")), no_grad, autocast)
            self._block(stmt.orelse, (*chain, Branch(stmt, "orelse")), no_grad, autocast)
        elif isinstance(stmt, ast.While):
            inner = (*chain, Branch(stmt, "body"))
            self._exprs([stmt.test], inner, no_grad, autocast)
            self._block(stmt.body, inner, no_grad, autocast)
            self._block(stmt.orelse, (*chain, Branch(stmt, "orelse")), no_grad, autocast)
        elif isinstance(stmt, ast.With | ast.AsyncWith):
            self._exprs([i.context_expr for i in stmt.items], chain, no_grad, autocast)
            inner_no_grad, inner_autocast = no_grad, autocast
            for item in stmt.items:
                gc = with_item_context(self.ctx, item.context_expr, self.autocast_names)
                if gc.no_grad:
                    inner_no_grad = True
                elif gc.grad_switch:
                    inner_no_grad = False
                if gc.autocast:
                    inner_autocast = stmt
                elif gc.autocast_off:
                    inner_autocast = None
            self._block(stmt.body, (*chain, Branch(stmt, "body")), inner_no_grad, inner_autocast)
        elif _is_try(stmt):
            body, handlers, orelse, finalbody = _try_parts(stmt)
            self._block(body, (*chain, Branch(stmt, "body")), no_grad, autocast)
            for i, handler in enumerate(handlers):
                self._block(handler.body, (*chain, Branch(stmt, f"handler{i}")), no_grad, autocast)
            self._block(orelse, (*chain, Branch(stmt, "orelse")), no_grad, autocast)
            self._block(finalbody, (*chain, Branch(stmt, "finalbody")), no_grad, autocast)
        elif isinstance(stmt, ast.Match):
            self._exprs([stmt.subject], chain, no_grad, autocast)
            for i, case in enumerate(stmt.cases):
                self._block(case.body, (*chain, Branch(stmt, f"case{i}")), no_grad, autocast)
        else:
            self._exprs([stmt], chain, no_grad, autocast)
            if _sets_grad_none(stmt):
                self.events.append(Event(ZERO, stmt, chain, no_grad=no_grad, autocast=autocast))


_JUMPS = (ast.Return, ast.Raise, ast.Continue, ast.Break)


def _is_try(stmt: ast.stmt) -> bool:
    return isinstance(stmt, ast.Try) or type(stmt).__name__ == "TryStar"


def _try_parts(
    stmt: ast.stmt,
) -> tuple[list[ast.stmt], list[ast.ExceptHandler], list[ast.stmt], list[ast.stmt]]:
    """body, handlers, orelse, finalbody of a `try` (or `try`/`except*`)."""
    return (
        getattr(stmt, "body", []),
        getattr(stmt, "handlers", []),
        getattr(stmt, "orelse", []),
        getattr(stmt, "finalbody", []),
    )


def _sets_grad_none(stmt: ast.stmt) -> bool:
    if isinstance(stmt, ast.Assign):
        return any(
            isinstance(t, ast.Attribute) and t.attr == "grad" for t in stmt.targets
        ) and isinstance(stmt.value, ast.Constant)
    if isinstance(stmt, ast.Delete):
        return any(isinstance(t, ast.Attribute) and t.attr == "grad" for t in stmt.targets)
    return False


# -- train/eval modes ------------------------------------------------------------------------

TRAIN = "train"  # model.train() / model.train(True)
BUILT = "built"  # freshly constructed: nn.Modules start in training mode
TRAINED = "trained"  # its output reached backward(): it was being trained
EVAL = "eval"  # model.eval() / model.train(False)
ENTRY = "entry"  # whatever the caller left it in
UNKNOWN = "unknown"
TRAINISH = frozenset({TRAIN, BUILT, TRAINED})


@dataclass(frozen=True)
class Origin:
    """Why a model may be in a mode at some point: the line that set it."""

    mode: str
    node: ast.AST | None  # in the analysed function (a call site for effects of callees)
    what: str  # "`model.eval()` at line 88", "`validate()` at line 120 (`model.eval()` ...)"

    @property
    def line(self) -> int:
        return getattr(self.node, "lineno", 0)


_ENTRY = Origin(ENTRY, None, "the caller's mode")
_SELF_ANY = "self.*"  # stands for every `self.<attr>` after an opaque call on self
_UNKNOWN = Origin(UNKNOWN, None, "unknown")
Origins = frozenset[Origin]


@dataclass
class State:
    modes: dict[str, Origins]
    forwarded: frozenset[str] = frozenset()  # models run outside no_grad since the last step

    def copy(self) -> State:
        return State(dict(self.modes), self.forwarded)

    def join(self, other: State | None, default: Origins) -> State:
        if other is None:
            return self.copy()
        modes = dict(self.modes)
        for key in set(modes) | set(other.modes):
            modes[key] = modes.get(key, default) | other.modes.get(key, default)
        return State(modes, self.forwarded | other.forwarded)

    def same(self, other: State) -> bool:
        return self.modes == other.modes and self.forwarded == other.forwarded


def _join(a: State | None, b: State | None, default: Origins) -> State | None:
    if a is None:
        return b.copy() if b is not None else None
    return a.join(b, default)


@dataclass
class ForwardCall:
    """A model run (`model(x)`) and what is known at that point."""

    node: ast.Call
    key: str
    origins: Origins
    region: str | None  # "strong": eval-named / val-loader loop; "weak": no_grad block with a loop
    region_node: ast.AST | None
    no_grad: bool
    grad_switch: bool
    in_loop: bool
    loop_node: ast.AST | None = None  # the innermost loop around it
    via: FunctionInfo | None = None  # the run happens inside this callee (call-site report)
    inner_line: int = 0  # line of the run inside the callee


@dataclass
class TrainingStep:
    """A backward()/step() while `key` (run outside no_grad before it) is in `origins`."""

    node: ast.AST
    what: str
    key: str
    origins: Origins


@dataclass
class Summary:
    """The effect of calling a function on the models it receives (keys in its own terms)."""

    exit: dict[str, Origins]  # keys whose mode it may change; ENTRY = maybe unchanged
    evals: dict[str, tuple[int, str]]  # key -> (line, region) of an eval run in the caller's mode
    trains: dict[str, tuple[int, str]]  # key -> (line, what) of a training step in caller's mode
    file: FileLoops
    name: str


@dataclass
class ModeResult:
    fi: FunctionInfo
    forwards: list[ForwardCall]
    steps: list[TrainingStep]
    final: State | None
    budget_exceeded: bool = False
    mode_set: frozenset[str] = frozenset()  # keys this function calls eval()/train() on

    def summary(self) -> Summary:
        exit_modes: dict[str, Origins] = {}
        if self.final is not None:
            for key, origins in self.final.modes.items():
                if origins != frozenset({_ENTRY}):
                    exit_modes[key] = origins
        evals: dict[str, tuple[int, str]] = {}
        for fc in self.forwards:
            # a function that sets the mode itself (`if train: model.train()`) chose it
            if fc.region is not None and _ENTRY in fc.origins and fc.key not in self.mode_set:
                evals.setdefault(fc.key, (fc.node.lineno, fc.region))
        trains: dict[str, tuple[int, str]] = {}
        for ts in self.steps:
            if _ENTRY in ts.origins:
                trains.setdefault(ts.key, (getattr(ts.node, "lineno", 0), ts.what))
        if self.budget_exceeded:
            evals, trains = {}, {}
        return Summary(exit_modes, evals, trains, self.fi.file, self.fi.label)


_BUDGET = 20_000  # statements interpreted per function, loops included


@dataclass
class _Frame:
    no_grad: bool
    grad_switch: bool
    region: str | None
    region_node: ast.AST | None
    loop_depth: int
    loop_node: ast.AST | None = None


class _LoopExit(Exception):
    pass


class ModeInterpreter:
    """Abstract interpretation of one function: the mode of every model on every path."""

    def __init__(self, fl: FileLoops, fi: FunctionInfo, *, entry: bool) -> None:
        self.fl = fl
        self.ctx = fl.ctx
        self.fi = fi
        self.default: Origins = frozenset({_ENTRY if entry else _UNKNOWN})
        self.forwards: dict[int, ForwardCall] = {}
        self.steps: dict[tuple[int, str], TrainingStep] = {}
        self.returns: list[State] = []
        self.loop_stack: list[tuple[list[State], list[State]]] = []  # (breaks, continues)
        self.budget = _BUDGET
        self.exceeded = False
        self._locals: set[str] | None = None
        self.autocast_names = fl.autocast_names()
        self._calls: dict[int, list[ast.Call]] = {}
        self.is_module_class = fi.cls is not None and self.ctx.is_module_class(fi.cls)
        self.mode_set: set[str] = set()  # keys whose mode this function sets itself

    def locals(self) -> set[str]:
        if self._locals is None:
            self._locals = self.fi.local_names() if not self.fi.is_module else set()
        return self._locals

    # -- driver ----------------------------------------------------------------
    def run(self) -> ModeResult:
        frame = _Frame(False, False, None, None, 0)
        fi = self.fi
        if not fi.is_module:
            node = fi.node
            assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
            no_grad = is_no_grad_decorated(self.ctx, node)
            region = None
            region_node: ast.AST | None = None
            if (
                is_eval_name(fi.name)
                and not (fi.name == "eval" and fi.cls is not None)
                and not _smoke_test(fi)
            ):
                region, region_node = "strong", node
            elif no_grad and any(isinstance(s, LoopNode) for s in fi.own_statements()):
                region, region_node = "weak", node
            frame = _Frame(no_grad, False, region, region_node, 0)
        state: State | None = State({})
        try:
            state = self._block(fi.body, state, frame)
        except _LoopExit:
            self.exceeded = True
        final = state
        for ret in self.returns:
            final = _join(final, ret, self.default)
        return ModeResult(
            fi,
            list(self.forwards.values()),
            list(self.steps.values()),
            final,
            self.exceeded,
            frozenset(self.mode_set),
        )

    def get(self, state: State, key: str) -> Origins:
        found = state.modes.get(key)
        if found is not None:
            return found
        # `model.module` shares the mode set on `model`
        while "." in key:
            key = key.rsplit(".", 1)[0]
            if key in state.modes:
                return state.modes[key]
        if key == "self" and _SELF_ANY in state.modes:
            return state.modes[_SELF_ANY]
        return self.default

    def set(self, state: State, key: str, origins: Origins) -> None:
        if key == _SELF_ANY:
            for other in [k for k in state.modes if k.startswith("self.")]:
                state.modes[other] = origins
        state.modes[key] = origins
        prefix = key + "."
        for other in [k for k in state.modes if k.startswith(prefix)]:
            del state.modes[other]

    # -- statements -------------------------------------------------------------------
    def _block(self, stmts: list[ast.stmt], state: State | None, frame: _Frame) -> State | None:
        for stmt in stmts:
            if state is None:
                return None
            self.budget -= 1
            if self.budget < 0:
                raise _LoopExit
            state = self._stmt(stmt, state, frame)
        return state

    def _stmt(self, stmt: ast.stmt, state: State, frame: _Frame) -> State | None:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            return state
        if isinstance(stmt, ast.If):
            self._exprs(stmt.test, state, frame)
            body, orelse = state.copy(), state.copy()
            none_key, none_in_body = _none_test(stmt.test)
            if none_key is not None:
                # `if encoder is not None: encoder.eval()`: where it is None it never runs
                self.set(body if none_in_body else orelse, none_key, frozenset())
            a = self._block(stmt.body, body, frame)
            b = self._block(stmt.orelse, orelse, frame)
            return _join(a, b, self.default)
        if isinstance(stmt, ast.For | ast.AsyncFor | ast.While):
            return self._loop(stmt, state, frame)
        if isinstance(stmt, ast.With | ast.AsyncWith):
            inner = frame
            for item in stmt.items:
                self._exprs(item.context_expr, state, frame)
                gc = with_item_context(self.ctx, item.context_expr, self.autocast_names)
                if gc.no_grad or gc.grad_switch:
                    region, region_node = inner.region, inner.region_node
                    if gc.no_grad and region is None and _contains_loop(stmt.body):
                        region, region_node = "weak", stmt
                    inner = _Frame(
                        gc.no_grad or inner.no_grad,
                        gc.grad_switch or inner.grad_switch,
                        region,
                        region_node,
                        inner.loop_depth,
                        inner.loop_node,
                    )
                if item.optional_vars is not None:
                    self._bind(item.optional_vars, None, state)
            return self._block(stmt.body, state, inner)
        if _is_try(stmt):
            try_body, handlers, try_else, finalbody = _try_parts(stmt)
            body_end = self._block(try_body, state.copy(), frame)
            start = _join(state, body_end, self.default)
            ends: list[State | None] = []
            for handler in handlers:
                ends.append(self._block(handler.body, start.copy() if start else None, frame))
            ends.append(self._block(try_else, body_end, frame) if body_end else None)
            out: State | None = None
            for end in ends:
                out = _join(out, end, self.default)
            if finalbody:
                if out is None and start is not None:
                    out = start.copy()
                out = self._block(finalbody, out, frame)
            return out
        if isinstance(stmt, ast.Match):
            self._exprs(stmt.subject, state, frame)
            out = None
            for case in stmt.cases:
                out = _join(out, self._block(case.body, state.copy(), frame), self.default)
            return _join(out, state, self.default)
        if isinstance(stmt, ast.Return):
            if stmt.value is not None:
                self._exprs(stmt.value, state, frame)
            self.returns.append(state)
            return None
        if isinstance(stmt, ast.Raise):
            return None
        if isinstance(stmt, ast.Break | ast.Continue):
            if self.loop_stack:
                breaks, continues = self.loop_stack[-1]
                (breaks if isinstance(stmt, ast.Break) else continues).append(state)
            return None
        if isinstance(stmt, ast.Assign | ast.AnnAssign):
            value = stmt.value
            if value is not None:
                self._exprs(value, state, frame)
            targets = stmt.targets if isinstance(stmt, ast.Assign) else [stmt.target]
            for target in targets:
                self._bind(target, value, state)
            return state
        self._exprs(stmt, state, frame)
        if isinstance(stmt, ast.AugAssign):
            self._bind(stmt.target, None, state)
        return state

    def _loop(
        self, stmt: ast.For | ast.AsyncFor | ast.While, state: State, frame: _Frame
    ) -> State | None:
        region, region_node = frame.region, frame.region_node
        if isinstance(stmt, ast.For | ast.AsyncFor):
            self._exprs(stmt.iter, state, frame)
            if region is None and is_eval_iterable(self.ctx.segment(stmt.iter)):
                region, region_node = "strong", stmt
        inner = _Frame(
            frame.no_grad, frame.grad_switch, region, region_node, frame.loop_depth + 1, stmt
        )
        head = state
        breaks: list[State] = []
        continues: list[State] = []
        for _ in range(3):
            breaks, continues = [], []
            self.loop_stack.append((breaks, continues))
            start = head.copy()
            if isinstance(stmt, ast.While):
                self._exprs(stmt.test, start, inner)
            else:
                self._bind(stmt.target, None, start)
            end = self._block(stmt.body, start, inner)
            self.loop_stack.pop()
            for c in continues:
                end = _join(end, c, self.default)
            new_head = head.join(end, self.default)
            if new_head.same(head):
                break
            head = new_head
        out: State | None = head
        if stmt.orelse:
            out = self._block(stmt.orelse, head.copy(), frame)
        for b in breaks:
            out = _join(out, b, self.default)
        return out

    def _bind(self, target: ast.expr, value: ast.expr | None, state: State) -> None:
        if isinstance(target, ast.Tuple | ast.List):
            for elt in target.elts:
                self._bind(elt, None, state)
            return
        if isinstance(target, ast.Starred):
            self._bind(target.value, None, state)
            return
        key = dotted(target)
        if key is None:
            return
        origins = self._value_origins(value, state) if value is not None else None
        if origins is None:
            if (
                key in state.modes
                or self.fl.is_model_key(key)
                or any(k.startswith(key + ".") for k in state.modes)
            ):
                self.set(state, key, frozenset({_UNKNOWN}))
            return
        self.set(state, key, origins)

    def _value_origins(self, value: ast.expr, state: State) -> Origins | None:
        """The mode of a model-valued expression: `Net().to(dev)`, `DDP(model)`, `model`."""
        if isinstance(value, ast.Name | ast.Attribute):
            key = dotted(value)
            if key is not None and (key in state.modes or self.fl.is_model_key(key)):
                return self.get(state, key)
            return None
        if not isinstance(value, ast.Call):
            return None
        func = value.func
        if isinstance(func, ast.Attribute):
            if func.attr == "eval" and not value.args:
                return frozenset(
                    {Origin(EVAL, value, f"`{self._short(value)}` at line {value.lineno}")}
                )
            if func.attr == "train":
                mode = _train_arg(value)
                if mode is None:
                    return frozenset({_UNKNOWN})
                return frozenset(
                    {Origin(mode, value, f"`{self._short(value)}` at line {value.lineno}")}
                )
            if func.attr in _SAME_MODULE_METHODS:
                return self._value_origins(func.value, state)
        name = self.ctx.qualname(func) or ""
        if name in _WRAPPERS or last_part(name) in (
            "DataParallel",
            "DistributedDataParallel",
            "DDP",
        ):
            return self._value_origins(value.args[0], state) if value.args else None
        if name == "copy.deepcopy" and value.args:
            return self._value_origins(value.args[0], state)
        if self.fl.is_module_constructor(value):
            return frozenset(
                {Origin(BUILT, value, f"`{self._short(value)}` at line {value.lineno}")}
            )
        return None

    def _short(self, node: ast.AST) -> str:
        text = " ".join(self.ctx.segment(node).split())
        if len(text) > 40 and isinstance(node, ast.Call):
            head = self.ctx.segment(node.func)
            text = f"{head}(...)" if len(head) < 40 else "this call"
        return text

    # -- expressions -------------------------------------------------------------------
    def _exprs(self, node: ast.AST, state: State, frame: _Frame) -> None:
        calls = self._calls.get(id(node))
        if calls is None:
            calls = post_order_calls(node)
            self._calls[id(node)] = calls
        for call in calls:
            self._call(call, state, frame)

    def _call(self, call: ast.Call, state: State, frame: _Frame) -> None:
        func = call.func
        key = chain_root(func.value) if isinstance(func, ast.Attribute) else None
        if isinstance(func, ast.Attribute) and key is not None:
            attr = func.attr
            if attr == "eval" and not call.args:
                self.mode_set.add(key)
                self.set(
                    state,
                    key,
                    frozenset({Origin(EVAL, call, f"`{key}.eval()` at line {call.lineno}")}),
                )
                return
            if attr == "train":
                self.mode_set.add(key)
                mode = _train_arg(call)
                origin = (
                    Origin(mode, call, f"`{self._short(call)}` at line {call.lineno}")
                    if mode is not None
                    else _UNKNOWN
                )
                self.set(state, key, frozenset({origin}))
                return
        kind, _ = classify_call(self.ctx, call)
        if kind == BACKWARD:
            self._training_step(call, "`" + self._short(call) + "`", state, frame)
            return
        if kind in (STEP, SCALER_STEP):
            self._training_step(call, "`" + self._short(call) + "`", state, frame, step=True)
            state.forwarded = frozenset()
            return
        if kind != CALL:
            return
        # a model run?
        target = dotted(func)
        if target is not None and self._is_model(target, state):
            self._forward(call, target, state, frame)
            return
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "forward"
            and key is not None
            and self._is_model(key, state)
        ):
            self._forward(call, key, state, frame)
            return
        passes_model = any(
            (k := dotted(a.value if isinstance(a, ast.Starred) else a)) is not None
            and self._is_model(k, state)
            for a in (*call.args, *(kw.value for kw in call.keywords))
        )
        resolved = self.fl.resolve(self.fi, call, other_files=passes_model)
        if resolved is not None:
            callee, as_method = resolved
            # a callee can only matter to modes here through a model it is given, `self`,
            # or a module-level model it uses by name
            relevant = (
                passes_model
                or as_method
                or (callee.file is self.fl and self._mentions_global_model(callee))
            )
            summary = callee.file.summary(callee) if relevant and callee is not self.fi else None
            if summary is not None:
                self._apply_summary(call, callee, as_method, summary, state, frame)
                return
        self._unknown_call(call, state)

    def _mentions_global_model(self, callee: FunctionInfo) -> bool:
        text = callee.text
        return any(k in text for k in self.fl.mode_keys() if "." not in k) or any(
            k in text for k in self.fl.module_models()
        )

    def _is_model(self, key: str, state: State) -> bool:
        if key == "self":
            return self.is_module_class
        origins = state.modes.get(key, frozenset())
        return any(o.mode not in (UNKNOWN, ENTRY) for o in origins) or self.fl.is_model_key(key)

    def _forward(self, call: ast.Call, key: str, state: State, frame: _Frame) -> None:
        origins = self.get(state, key)
        found = self.forwards.get(id(call))
        if found is None:
            self.forwards[id(call)] = ForwardCall(
                call,
                key,
                origins,
                frame.region,
                frame.region_node,
                frame.no_grad,
                frame.grad_switch,
                frame.loop_depth > 0,
                frame.loop_node,
            )
        else:
            found.origins = found.origins | origins
        if not frame.no_grad:
            state.forwarded = state.forwarded | {key}

    def _training_step(
        self, node: ast.AST, what: str, state: State, frame: _Frame, *, step: bool = False
    ) -> None:
        for key in state.forwarded:
            origins = self.get(state, key)
            slot = (id(node), key)
            found = self.steps.get(slot)
            if found is None:
                self.steps[slot] = TrainingStep(node, what, key, origins)
            else:
                found.origins = found.origins | origins
            # an optimizer step after its output reached backward(): it is being trained,
            # so -- unless the file manages its mode with eval() -- it is in training mode
            if not step or self.fl.ever_set_to_eval(key) or not self.fl.optimized(key):
                continue
            trained = Origin(TRAINED, node, f"{what} at line {getattr(node, 'lineno', 0)}")
            kept = frozenset(o for o in origins if o.mode in (EVAL, TRAIN, TRAINED))
            if kept != origins:
                if not any(o.mode in (TRAIN, TRAINED) for o in kept):
                    kept = kept | {trained}
                self.set(state, key, kept)

    def _unknown_call(self, call: ast.Call, state: State) -> None:
        """A call we cannot see into: models it receives may come back in any mode."""
        name = self.ctx.qualname(call.func) or ""
        if name in _MODE_SAFE_FUNCTIONS or name.startswith(("torch.", "logging.", "math.")):
            return
        func = call.func
        if isinstance(func, ast.Attribute):
            owner = dotted(func.value)
            if (
                owner is not None
                and (owner in state.modes or self.fl.is_model_key(owner))
                and func.attr not in _MODE_SAFE_METHODS
            ):
                self.set(state, owner, frozenset({_UNKNOWN}))
            if owner == "self" or any(
                isinstance(a, ast.Name) and a.id == "self" for a in call.args
            ):
                # an inherited method (or a helper given `self`) may set any self.model's mode
                self.set(state, _SELF_ANY, frozenset({_UNKNOWN}))
        for arg in (*call.args, *(kw.value for kw in call.keywords)):
            if isinstance(arg, ast.Starred):
                arg = arg.value
            key = dotted(arg)
            if key is not None and (key in state.modes or self.fl.is_model_key(key)):
                self.set(state, key, frozenset({_UNKNOWN}))

    def _apply_summary(
        self,
        call: ast.Call,
        callee: FunctionInfo,
        as_method: bool,
        summary: Summary,
        state: State,
        frame: _Frame,
    ) -> None:
        mapping = self._map_keys(call, callee, as_method, summary)
        where = "" if callee.file is self.fl else f" in {os.path.basename(callee.file.ctx.path)}"
        call_text = f"`{self.ctx.segment(call.func)}()`"
        # runs of the caller's model inside the callee, in the caller's mode
        for ckey, (line, region) in summary.evals.items():
            mine = mapping.get(ckey)
            if mine is None:
                continue
            origins = self.get(state, mine)
            slot = self.forwards.get(id(call))
            if slot is None or slot.key != mine:
                self.forwards[id(call)] = ForwardCall(
                    call,
                    mine,
                    origins,
                    region,
                    callee.node if not callee.is_module else None,
                    frame.no_grad,
                    frame.grad_switch,
                    frame.loop_depth > 0,
                    frame.loop_node,
                    via=callee,
                    inner_line=line,
                )
            else:
                slot.origins = slot.origins | origins
        for ckey in summary.trains:
            mine = mapping.get(ckey)
            if mine is None:
                continue
            state.forwarded = state.forwarded | {mine}
        if any(ckey in mapping for ckey in summary.trains):
            self._training_step(
                call,
                f"{call_text} (its {next(iter(summary.trains.values()))[1]}{where})",
                state,
                frame,
                step=True,
            )
        # the modes it leaves behind
        for ckey, origins in summary.exit.items():
            mine = mapping.get(ckey)
            if mine is None:
                continue
            before = self.get(state, mine)
            new: set[Origin] = set()
            for o in origins:
                if o.mode == ENTRY:
                    new |= before
                elif o.mode == UNKNOWN:
                    new.add(_UNKNOWN)
                else:
                    inner = o.what.split(" (", 1)[0]
                    new.add(
                        Origin(
                            o.mode,
                            call,
                            f"{inner} in {callee.label}{where} (called at line {call.lineno})",
                        )
                    )
            self.set(state, mine, frozenset(new))
        # arguments the callee never touched keep their mode; models it got but we could
        # not map (e.g. passed through *args) are unknown
        for arg in (*call.args, *(kw.value for kw in call.keywords)):
            if isinstance(arg, ast.Starred):
                inner_key = dotted(arg.value)
                if inner_key is not None and self._is_model(inner_key, state):
                    self.set(state, inner_key, frozenset({_UNKNOWN}))

    def _map_keys(
        self, call: ast.Call, callee: FunctionInfo, as_method: bool, summary: Summary
    ) -> dict[str, str]:
        """Callee key -> caller key for every key the summary mentions."""
        params = callee.params()
        bound: dict[str, str] = {}
        for name, arg in zip(params, call.args, strict=False):
            if isinstance(arg, ast.Starred):
                break
            key = dotted(arg)
            if key is not None:
                bound[name] = key
        for kw in call.keywords:
            if kw.arg is not None:
                key = dotted(kw.value)
                if key is not None:
                    bound[kw.arg] = key
        callee_locals = callee.local_names()
        mapping: dict[str, str] = {}
        keys = set(summary.exit) | set(summary.evals) | set(summary.trains)
        for ckey in keys:
            head, _, rest = ckey.partition(".")
            if head in bound:
                mapping[ckey] = bound[head] + ("." + rest if rest else "")
            elif head == "self":
                if as_method:
                    mapping[ckey] = ckey
            elif (
                head not in callee_locals
                and head not in params
                and callee.file is self.fl
                and (self.fi.is_module or head not in self.locals())
            ):
                # a global of the callee's module: the same name here if it is global here
                mapping[ckey] = ckey
        return mapping


def chain_root(node: ast.expr) -> str | None:
    """`model` for `model.to(device)` / `model.cuda().half()`; dotted name otherwise."""
    while (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in _SAME_MODULE_METHODS | {"eval", "train"}
    ):
        node = node.func.value
    return dotted(node)


def _train_arg(call: ast.Call) -> str | None:
    """`.train()` -> TRAIN, `.train(False)` -> EVAL, `.train(flag)` -> None (unknown)."""
    args = [*call.args, *(kw.value for kw in call.keywords if kw.arg == "mode")]
    if not args:
        return TRAIN
    if isinstance(args[0], ast.Constant) and isinstance(args[0].value, bool):
        return TRAIN if args[0].value else EVAL
    return None


def _smoke_test(fi: FunctionInfo) -> bool:
    """`def test():` with no parameters that feeds the model tensors it makes itself
    (no loop over a loader or dataset): a shape check, not an evaluation."""
    if words(fi.name)[:1] != ["test"] or fi.params() or fi.keyword_params():
        return False
    for stmt in fi.own_statements():
        if isinstance(stmt, ast.For | ast.AsyncFor):
            it = stmt.iter
            ranged = (
                isinstance(it, ast.Call)
                and isinstance(it.func, ast.Name)
                and it.func.id in ("range", "len")
            )
            if not ranged:
                return False
    return True


def _none_test(test: ast.expr) -> tuple[str | None, bool]:
    """(key, whether the `if` body is where it is None) for `if x is None` / `if x`."""
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        right = test.comparators[0]
        if isinstance(right, ast.Constant) and right.value is None:
            key = dotted(test.left)
            if isinstance(test.ops[0], ast.Is):
                return key, True
            if isinstance(test.ops[0], ast.IsNot):
                return key, False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        key = dotted(test.operand)
        if key is not None:
            return key, True
    key = dotted(test)
    if (key is not None and "." not in key) or (key is not None and key.startswith("self.")):
        return key, False
    return None, False


def _contains_loop(stmts: list[ast.stmt]) -> bool:
    todo = list(stmts)
    while todo:
        stmt = todo.pop()
        if isinstance(stmt, LoopNode):
            return True
        if not isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            todo.extend(child_statements(stmt))
    return False


def describe_origins(origins: Iterable[Origin], modes: frozenset[str]) -> str:
    """`model.train()` at line 80 / `model.eval()` at line 88 ...: the proof, for messages."""
    chosen = sorted((o for o in origins if o.mode in modes), key=lambda o: o.line)
    return " and ".join(o.what for o in chosen[:2])
