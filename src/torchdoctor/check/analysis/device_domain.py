"""The values a device setting accepts, as the code declares them (TD101).

A command-line option or a configuration field whose declared values include a device
other than CUDA says that the program runs off the GPU too; a `"cuda"` default there
makes the plain run (no option given, the default configuration) fail on a machine
without one. What counts as a declaration:

- an option's choices: `parser.add_argument("--device", default="cuda",
  choices=["cuda", "cpu"])`, `@click.option("--device", default="cuda",
  type=click.Choice(["cuda", "cpu", "mps"]))`, also through a module-level name bound
  once to such a list;
- a field's type: `device: Literal["cuda", "cpu", "auto"] = "cuda"`;
- a validator of the field in its class: a method decorated for the field
  (`@field_validator("device")`, `@validator("device")`, attrs' `@device.validator`)
  or any method testing `self.device`, that tests membership in a literal collection
  (`if value not in {"cuda", "cpu", "auto"}: raise ...`).

A plain string parameter (`def run(device="cuda")`) declares nothing: its caller
chooses, and TD101 leaves it alone.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.syntax import assigned_values
from torchdoctor.check.tree_walk import walk

if TYPE_CHECKING:
    from torchdoctor.check.context import FileContext

# Devices other than CUDA a setting may offer ("auto": the program picks what exists).
OTHER_DEVICES = ("auto", "cpu", "mps", "xpu")
# Calls that declare a command-line option, by their last name.
_OPTION_CALLS = frozenset({"add_argument", "option", "argument", "Option", "Argument"})
_CHOICE_TYPES = frozenset({"Choice"})  # click.Choice([...])


def is_option_call(call: ast.Call) -> bool:
    func = call.func
    name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
    return name in _OPTION_CALLS


def option_offers(ctx: FileContext, call: ast.Call) -> list[str]:
    """The non-CUDA devices among an option's declared choices."""
    for kw in call.keywords:
        if kw.arg == "choices":
            return _others(_strings(ctx, kw.value))
        if kw.arg == "type" and isinstance(kw.value, ast.Call):
            func = kw.value.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name in _CHOICE_TYPES and kw.value.args:
                return _others(_strings(ctx, kw.value.args[0]))
    return []


def field_offers(cls: ast.ClassDef, name: str, annotation: ast.expr | None) -> list[str]:
    """The non-CUDA devices a class field declares it accepts (its `Literal` type, or
    a validator's membership test)."""
    if annotation is not None:
        found = _others(_literal_type_values(annotation))
        if found:
            return found
    for stmt in cls.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef):
            subject = _validated_subject(stmt, name)
            found = _others(_tested_values(stmt, name, subject))
            if found:
                return found
    return []


def _validated_subject(function: ast.FunctionDef | ast.AsyncFunctionDef, name: str) -> str:
    """The parameter holding the field's value when `function` validates the field
    (its second parameter: `def check(cls, value)`), else ""."""
    for decorator in function.decorator_list:
        named = False
        if isinstance(decorator, ast.Call):
            named = any(isinstance(a, ast.Constant) and a.value == name for a in decorator.args)
        elif isinstance(decorator, ast.Attribute):  # attrs: @device.validator
            named = isinstance(decorator.value, ast.Name) and decorator.value.id == name
        params = [*function.args.posonlyargs, *function.args.args]
        if named and params:
            return params[-1].arg
    return ""


def _tested_values(
    function: ast.FunctionDef | ast.AsyncFunctionDef, name: str, subject: str
) -> list[str]:
    """Strings of literal collections the function tests the field against
    (`value in {...}`, `self.device not in (...)`)."""
    values: list[str] = []
    for node in walk(function):
        if not (
            isinstance(node, ast.Compare)
            and len(node.ops) == 1
            and isinstance(node.ops[0], ast.In | ast.NotIn)
        ):
            continue
        left = node.left
        is_field = (isinstance(left, ast.Name) and subject and left.id == subject) or (
            isinstance(left, ast.Attribute)
            and left.attr == name
            and isinstance(left.value, ast.Name)
            and left.value.id == "self"
        )
        if is_field:
            values += _literal_strings(node.comparators[0])
    return values


def _literal_type_values(annotation: ast.expr) -> list[str]:
    """String values of `Literal[...]` anywhere in the annotation (`Optional[Literal]`)."""
    values: list[str] = []
    for node in walk(annotation):
        if isinstance(node, ast.Subscript):
            base = node.value
            base_name = base.attr if isinstance(base, ast.Attribute) else getattr(base, "id", "")
            if base_name == "Literal":
                values += _literal_strings(node.slice)
    return values


def _strings(ctx: FileContext, node: ast.expr) -> list[str]:
    """A literal collection of strings, or a name the module binds once, to one."""
    if isinstance(node, ast.Name):
        bound = assigned_values(ctx.tree, node.id)
        return _literal_strings(bound[0]) if bound is not None and len(bound) == 1 else []
    return _literal_strings(node)


def _literal_strings(node: ast.expr) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]  # Literal["cpu"]
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        elements = [e for e in node.elts if isinstance(e, ast.Constant)]
        return [e.value for e in elements if isinstance(e.value, str)]
    return []


def _others(values: list[str]) -> list[str]:
    return [v for v in OTHER_DEVICES if v in {s.lower() for s in values}]
