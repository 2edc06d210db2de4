"""Train/eval mode: origins, states, and the summaries of functions."""

from __future__ import annotations

import ast
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, cast

from torchdoctor.check.analysis.functions import FunctionInfo
from torchdoctor.check.analysis.grad_contexts import _SAME_MODULE_METHODS
from torchdoctor.check.analysis.names import LoopNode
from torchdoctor.check.analysis.syntax import dotted, words
from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import child_statements

if TYPE_CHECKING:
    pass


TRAIN = "train"  # model.train() / model.train(True)


BUILT = "built"  # freshly constructed: nn.Modules start in training mode


TRAINED = "trained"  # its output reached backward(): it was being trained


EVAL = "eval"  # model.eval() / model.train(False)


ENTRY = "entry"  # whatever the caller left it in


UNKNOWN_MODE = "unknown"


TRAINISH = frozenset({TRAIN, BUILT, TRAINED})


@dataclass(frozen=True)
class Origin:
    """Why a model may be in a mode at some point: the line that set it."""

    mode: str
    node: ast.AST | None  # in the analysed function (a call site for effects of callees)
    what: str  # "`model.eval()` at line 88", "`validate()` at line 120 (`model.eval()` ...)"
    # a class-level fact: the `self.<attr> = ...` in `__init__` that stored the model
    stored: ast.AST | None = None
    # for the effect of a callee of the same file: the line inside it that set the mode
    # (`model.eval()` in `validate()`), where a report can point at the code to change
    inner: ast.AST | None = None

    @property
    def line(self) -> int:
        return getattr(self.node, "lineno", 0)


_ENTRY = Origin(ENTRY, None, "the caller's mode")


_SELF_ANY = "self.*"  # stands for every `self.<attr>` after an opaque call on self


_UNKNOWN = Origin(UNKNOWN_MODE, None, "unknown")


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
    file: LoopFacts
    name: str
    # key -> line of a plain run (no evaluation region, gradients on) of a model it is given,
    # in the caller's mode: a helper (`forward_step(model, batch)`) the caller's region owns
    runs: dict[str, int] = field(default_factory=dict)


class LoopFacts(Protocol):
    """What the mode interpreter and the event collector ask of their file
    (implemented by `file_loops.FileLoops`)."""

    ctx: FileContext

    def words(self) -> frozenset[str]: ...
    def evaluation_words(self) -> list[str]: ...
    def model_words(self) -> list[str]: ...
    def evaluation_lines(self) -> list[int]: ...
    def model_lines(self) -> list[int]: ...
    def module_models(self) -> frozenset[str]: ...
    def mode_keys(self) -> frozenset[str]: ...
    def ever_set_to_eval(self, key: str) -> bool: ...
    def optimized(self, key: str) -> bool: ...
    def autocast_names(self) -> frozenset[str]: ...
    def is_model_key(self, key: str) -> bool: ...
    def is_module_constructor(self, call: ast.Call) -> bool: ...
    def resolve(
        self, fi: FunctionInfo, call: ast.Call, *, other_files: bool = True
    ) -> tuple[FunctionInfo, bool] | None: ...
    def summary(self, fi: FunctionInfo) -> Summary | None: ...
    def sole_override(self, fi: FunctionInfo) -> FunctionInfo | None: ...
    def backward_params(self, fi: FunctionInfo) -> frozenset[str]: ...
    def all_functions(self) -> list[FunctionInfo]: ...
    def held_models(self, cls: ast.ClassDef) -> dict[str, Origin]: ...
    def modes(self, fi: FunctionInfo) -> ModeResult: ...


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
                if origins != frozenset({_ENTRY}) and any(o.stored is None for o in origins):
                    # (a class-level fact at entry is the caller's too: not an effect)
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
        runs: dict[str, int] = {}
        for fc in self.forwards:
            if (
                fc.region is None
                and fc.via is None
                and not fc.no_grad
                and not fc.grad_switch
                and _ENTRY in fc.origins
                and fc.key not in self.mode_set
                and fc.key not in trains
            ):
                runs.setdefault(fc.key, fc.node.lineno)
        if self.budget_exceeded:
            evals, trains, runs = {}, {}, {}
        # every FunctionInfo's file is a FileLoops, which has all of LoopFacts
        file = cast(LoopFacts, self.fi.file)
        return Summary(exit_modes, evals, trains, file, self.fi.label, runs)


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
    # Two origins of one call site (the effects of two callees) come shorter text first
    # (the more direct one), then by text: not in the order of the set holding them,
    # which changes from run to run.
    chosen = sorted(
        (o for o in origins if o.mode in modes), key=lambda o: (o.line, len(o.what), o.what)
    )
    return " and ".join(o.what for o in chosen[:2])
