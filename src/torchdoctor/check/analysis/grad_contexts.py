"""Gradient and mode contexts: no_grad, autocast, decorators, mode-safe calls."""

from __future__ import annotations

import ast
import functools
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.names import FuncNode
from torchdoctor.check.analysis.syntax import dotted, last_part
from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import child_fields

if TYPE_CHECKING:
    pass


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


# What zeroes gradients, besides the names `zero_grad`, `_foreach_zero_` and
# `set_to_none` (plain substrings). Each pattern starts with a literal, which the regex
# engine finds by a fast scan; one alternation of them all tried every position of
# the text (a third of a second on PyTorch's tree).
_GRAD_RESET = re.compile(r"\.grad(?:\s*=\s*None|(?:\.data)?\.(?:zero_|fill_|mul_|detach_))")
_GRAD_DELETED = re.compile(r"del\s+\S+\.grad\b")


def mentions_zeroing(text: str) -> bool:
    if "zero_grad" in text or "_foreach_zero_" in text or "set_to_none" in text:
        return True
    if ".grad" not in text:  # both patterns hold it
        return False
    return bool(_GRAD_RESET.search(text) or _GRAD_DELETED.search(text))


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
        # any library's `no_grad()` (`paddle.no_grad()`, a project's wrapper), as for
        # decorators: the name is the convention for a context with gradients off
        if name in _NO_GRAD_CALLS or name.rsplit(".", 1)[-1] in ("no_grad", "inference_mode"):
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


# What turns gradients off, in a file's text: the context managers and decorators, and the
# training frameworks whose evaluation loops run the model under no_grad themselves.
_GRAD_OFF_WORDS = (
    "no_grad",
    "inference_mode",
    "set_grad_enabled",
    "lightning",
    "ignite",
    "transformers",
    "fastai",
    "skorch",
    "poutyne",
    "catalyst",
    "torchbearer",
    "mmengine",
    "mmcv",
    "detectron2",
)


# A module's forward that records a graph only in training mode: gradients are off in
# that forward alone, not around any other call of the project.
_OWN_FORWARD_SWITCH = re.compile(r"set_grad_enabled\(\s*self\.training\s*\)")


def may_turn_grad_off(text: str) -> bool:
    """Whether a file may run code with gradients off (or hand it to a framework that
    does): a project none of whose files does runs every forward pass with them on."""
    if "set_grad_enabled" in text:
        text = _OWN_FORWARD_SWITCH.sub("", text)
    return any(w in text for w in _GRAD_OFF_WORDS)


# `model.module.mask_net(`: a method called through a receiver other than `self` (or
# `super()`, the class's own family).
_OUTSIDE_CALL = re.compile(r"(?<!\bself)(?<!\bsuper\(\))\.([A-Za-z_]\w*)\s*\(")


def outside_calls(text: str) -> frozenset[str]:
    """The method names a file calls through a receiver other than `self`."""
    return frozenset(_OUTSIDE_CALL.findall(text))
