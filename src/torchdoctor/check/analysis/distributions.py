"""torch.distributions objects: where their parameter tensors are (`library.toml` [distributions]).

`Normal(mu, sigma)` holds `mu` and `sigma`: the object is a `Kind.DISTRIBUTION` value on
their place. What combines its parameters with other tensors (`kl_divergence(p, q)`,
`p.log_prob(x)`) is a meeting of those places; what it samples or reports (`p.sample()`,
`p.mean`) is a tensor where the parameters are.
"""

from __future__ import annotations

import ast
import dataclasses

from torchdoctor.check.analysis.torch_api import LIBRARY
from torchdoctor.check.analysis.values import Kind, Place, Value

_TABLE = LIBRARY["distributions"]
CLASSES = frozenset(_TABLE["classes"])
MEETING_FUNCTIONS = frozenset(_TABLE["meeting_functions"])
MEETING_METHODS = frozenset(_TABLE["meeting_methods"])
TENSOR_RESULTS = frozenset(_TABLE["tensor_results"])

# constructor arguments that are no parameter tensor
_OPTIONS = frozenset({"validate_args"})


def parameters(
    node: ast.Call, args: list[Value], keywords: list[tuple[str | None, Value]]
) -> list[tuple[ast.expr, Value]] | None:
    """The parameter tensors a constructor call is given, as tensors (a distribution
    argument, `Independent(Normal(...), 1)`, counts as its parameters). Numbers and None
    are no tensors. None when an argument may be a tensor whose place is not known and
    none is on the device: the object's place is then not known either."""
    given = [*zip(node.args, args, strict=False)]
    given += [
        (kw.value, value)
        for kw, (_, value) in zip(node.keywords, keywords, strict=False)
        if kw.arg not in _OPTIONS
    ]
    operands: list[tuple[ast.expr, Value]] = []
    unknown = any(kw.arg is None for kw in node.keywords)
    for arg_node, value in given:
        if isinstance(arg_node, ast.Starred):
            unknown = True
        elif value.kind is Kind.DISTRIBUTION or value.tensor_like:
            operands.append((arg_node, as_tensor(value)))
        elif not _number(arg_node):
            unknown = True
    if not operands:
        return None
    if unknown and not any(v.place is Place.DEVICE for _, v in operands):
        return None
    return operands


def as_tensor(value: Value) -> Value:
    """A distribution as an operand of a meeting: the tensors it holds. One on the device
    stays a distribution (the side a mismatch names: it has no `.device` of its own)."""
    if value.kind is Kind.DISTRIBUTION and value.place is not Place.DEVICE:
        return dataclasses.replace(value, kind=Kind.TENSOR)
    return value


def distribution(combined: Value) -> Value:
    """The object holding parameters `combined` gives the place of."""
    return dataclasses.replace(combined, kind=Kind.DISTRIBUTION, output=False)


def result(recv: Value) -> Value:
    """A tensor computed from the distribution's parameters alone (`d.sample()`)."""
    return dataclasses.replace(recv, kind=Kind.TENSOR, scalar=False)


def _number(node: ast.expr) -> bool:
    if isinstance(node, ast.UnaryOp):
        node = node.operand
    return isinstance(node, ast.Constant) and (
        node.value is None or isinstance(node.value, int | float)
    )
