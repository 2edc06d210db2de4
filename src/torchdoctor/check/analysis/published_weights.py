"""Files PyTorch publishes: weights from `download.pytorch.org` hold CPU tensors (TD402).

torchvision, torchaudio and torch.hub's own weights are saved from the CPU and loaded
by torchvision itself without `map_location`; a load of one needs no GPU. What counts
as such a file in the code:

- a URL string starting with the host (`"https://download.pytorch.org/models/..."`),
  also an f-string whose text starts with it;
- a name every binding of which in the scope (or at module level) is such a URL;
- an item of a dict literal bound once at module level (or in the scope) whose values
  are all such URLs: `model_urls[arch]`, `model_urls.get(arch)`.
"""

from __future__ import annotations

import ast

from torchdoctor.check.analysis.syntax import assigned_values

_HOSTS = ("https://download.pytorch.org/", "http://download.pytorch.org/")


def published_by_pytorch(source: ast.expr, scope: ast.AST, module: ast.Module) -> bool:
    """Whether the file `source` names is one of PyTorch's published weights."""
    if _is_url(source):
        return True
    if isinstance(source, ast.Name):
        values = _bindings(source.id, scope, module)
        return bool(values) and all(_is_url(v) for v in values)
    table = _table_of(source)
    if table is not None:
        values = _bindings(table, scope, module)
        return len(values) == 1 and _all_urls(values[0])
    return False


def _is_url(node: ast.expr) -> bool:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return node.value.startswith(_HOSTS)
    if isinstance(node, ast.JoinedStr) and node.values:
        head = node.values[0]
        return isinstance(head, ast.Constant) and str(head.value).startswith(_HOSTS)
    return False


def _table_of(source: ast.expr) -> str | None:
    """`model_urls[arch]` / `model_urls.get(arch)`: the dict's name."""
    if isinstance(source, ast.Subscript) and isinstance(source.value, ast.Name):
        return source.value.id
    if (
        isinstance(source, ast.Call)
        and isinstance(source.func, ast.Attribute)
        and source.func.attr == "get"
        and isinstance(source.func.value, ast.Name)
    ):
        return source.func.value.id
    return None


def _all_urls(node: ast.expr) -> bool:
    return (
        isinstance(node, ast.Dict)
        and bool(node.values)
        and all(v is not None and _is_url(v) for v in node.values)
    )


def _bindings(name: str, scope: ast.AST, module: ast.Module) -> list[ast.expr]:
    """Values assigned to `name` in the scope, or else in the module (none when the name
    is also bound some other way: a loop, an unpacking, an annotated or augmented
    assignment)."""
    for where in (scope, module):  # (in the module also functions' own names: stricter)
        values = assigned_values(where, name)
        if values is None:
            return []
        if values:
            return values
    return []
