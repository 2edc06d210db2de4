"""Training-loop events (backward, step, zero_grad, ...) and their order along paths."""

from __future__ import annotations

import ast
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.names import LoopNode
from torchdoctor.check.analysis.syntax import binding_targets, dotted
from torchdoctor.check.tree_walk import walk

if TYPE_CHECKING:
    pass


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
    via: str | None = None  # backward: run inside this function of the file, given `expr`
    # inlined from a callee (inline_events): the call in the analysed function it runs
    # under, and its rank among the events of the call tree (their execution order)
    site: ast.AST | None = None
    rank: int = 0

    @property
    def line(self) -> int:
        return getattr(self.node, "lineno", 0)

    @property
    def order(self) -> tuple[int, ...]:
        at = self.node if self.site is None else self.site
        end = (getattr(at, "end_lineno", 0) or 0, getattr(at, "end_col_offset", 0) or 0)
        return end if self.site is None else (*end, self.rank)

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


def opposite_sides(a: Event, b: Event, scope: ast.AST) -> bool:
    """Whether `a` and `b` sit on opposite sides of two `if`s testing one setting (`flag`,
    `self.fp16`) that `scope` does not rebind between them (`if self.fp16:
    scaler.scale(loss).backward()` ... later `if self.fp16: scaler.step(opt) else:
    opt.step()`): no run executes both."""
    for x in a.chain:
        for y in b.chain:
            if not (
                x.node is not y.node
                and isinstance(x.node, ast.If)
                and isinstance(y.node, ast.If)
                and {x.label, y.label} == {"body", "orelse"}
            ):
                continue
            setting = dotted(x.node.test)
            if (
                setting is not None
                and setting == dotted(y.node.test)
                and not _rebinds(scope, setting, x.node, y.node)
            ):
                return True
    return False


def _rebinds(scope: ast.AST, setting: str, first: ast.If, second: ast.If) -> bool:
    """A binding of `setting` between the two tests (one pass of a loop sees one value)."""
    start = min(first.lineno, second.lineno)
    end = max(first.end_lineno or first.lineno, second.end_lineno or second.lineno)
    return any(
        start <= getattr(node, "lineno", 0) <= end
        and any(dotted(t) == setting for t in binding_targets(node, walrus=True))
        for node in walk(scope)
    )


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


def if_branches_within(event: Event, loop: ast.AST) -> list[Branch]:
    """The `if` branches of `event`'s chain between `loop` and `event`."""
    chain = [b.node for b in event.chain]
    start = next((i for i, node in enumerate(chain) if node is loop), None)
    if start is None:
        return []
    return [b for b in event.chain[start + 1 :] if isinstance(b.node, ast.If)]


def invariant_guards(
    event: Event, other: Event, loop: ast.AST, extra: Sequence[ast.AST] = ()
) -> list[Branch]:
    """The `if` branches between `loop` and `event` that `other` is not in and whose test
    cannot change from pass to pass (`if args.moe:` -- not `if i % k == 0`, not a call):
    on the passes where such a test goes the other way, `event` does not run. `extra`:
    the functions the loop's calls run in place (inlined events), which may assign too."""
    found: list[Branch] = []
    for b in if_branches_within(event, loop):
        assert isinstance(b.node, ast.If)
        if any(
            o.label == b.label
            and isinstance(o.node, ast.If)
            and (o.node is b.node or ast.unparse(o.node.test) == ast.unparse(b.node.test))
            for o in other.chain
        ):
            continue  # `other` runs under the same test (`if not frozen:` twice)
        if loop_invariant(b.node.test, loop, extra):
            found.append(b)
    return found


def loop_invariant(test: ast.expr, loop: ast.AST, extra: Sequence[ast.AST] = ()) -> bool:
    """No call in `test`, and no name it reads is assigned anywhere in `loop` (or in
    `extra`, functions the loop runs)."""
    read: set[str] = set()
    for node in walk(test):
        if isinstance(node, ast.Call | ast.Await | ast.NamedExpr):
            return False
        if isinstance(node, ast.Name | ast.Attribute):
            text = dotted(node)
            if text is not None:
                read.add(text)
    if not read:
        return False
    # `self.flag` reads `self.flag`, not all of `self` (which `self.i = ...` changes)
    read = {r for r in read if not any(o.startswith(r + ".") for o in read)}
    for scope in (loop, *extra):
        for node in walk(scope):
            for text in _rebound(node):
                if any(
                    r == text or r.startswith(text + ".") or text.startswith(r + ".") for r in read
                ):
                    return False
    return True


def _rebound(node: ast.AST) -> list[str]:
    """What a statement rebinds or changes in place: `self.i = 0` changes `self.i`, not
    `self` (unlike `bound_keys`, which counts every name inside a target)."""
    targets = binding_targets(node, walrus=True)
    keys: list[str] = []
    while targets:
        target = targets.pop()
        if isinstance(target, ast.Tuple | ast.List):
            targets.extend(target.elts)
        elif isinstance(target, ast.Starred):
            targets.append(target.value)
        elif isinstance(target, ast.Subscript):
            targets.append(target.value)  # `x[i] = v` changes x
        else:
            key = dotted(target)
            if key is not None:
                keys.append(key)
    return keys


def zero_passes(event: Event, loop: ast.AST) -> set[str]:
    """The counters `x % k` (as text) that must be 0 for `event` to run on a pass of `loop`:
    an `if (i + 1) % k == 0:` / `if not i % k:` around it (or the `else:` of `if i % k:`),
    or an `if (i + 1) % k: continue` before it in a block that holds it."""
    found: set[str] = set()
    at = event.site if event.site is not None else event.node
    line = getattr(at, "lineno", 0)
    inside = False
    for b in event.chain:
        if b.node is loop:
            inside = True
        if not inside:
            continue
        if isinstance(b.node, ast.If) and b.node is not loop:
            sense = _counter_sense(b.node.test)
            if sense is not None and sense[1] == (b.label == "body"):
                found.add(sense[0])
        block = getattr(b.node, b.label, None) if b.label in ("body", "orelse") else None
        start, end = getattr(b.node, "lineno", 0), getattr(b.node, "end_lineno", 0) or 0
        if not isinstance(block, list) or not start <= line <= end:
            continue
        for stmt in block:
            if getattr(stmt, "end_lineno", 0) >= line:
                break
            if (
                isinstance(stmt, ast.If)
                and len(stmt.body) == 1
                and isinstance(stmt.body[0], ast.Continue)
                and not stmt.orelse
            ):
                sense = _counter_sense(stmt.test)
                if sense is not None and not sense[1]:
                    found.add(sense[0])
    return found


def _counter_sense(test: ast.expr) -> tuple[str, bool] | None:
    """(`x % k`, True) for `x % k == 0` / `not x % k`; (`x % k`, False) for `x % k` /
    `x % k != 0`; None for any other test."""
    negate = False
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        test, negate = test.operand, True
    if (
        isinstance(test, ast.Compare)
        and len(test.ops) == 1
        and isinstance(test.comparators[0], ast.Constant)
        and test.comparators[0].value == 0
        and isinstance(test.ops[0], ast.Eq | ast.NotEq)
    ):
        zero = isinstance(test.ops[0], ast.Eq)
        test = test.left
    else:
        zero = False
    if not (isinstance(test, ast.BinOp) and isinstance(test.op, ast.Mod)):
        return None
    if modulo_test(test) is None:
        return None
    return ast.unparse(test), zero != negate
