"""The import aliases of a file: each name an import binds, mapped to its dotted target
(and, after a star import, the conventional names such as `F` the file uses unbound)."""

from __future__ import annotations

import ast

from torchdoctor.check.tree_walk import child_statements, spans_a_line, walk


def collect_imports(
    tree: ast.Module, lines: list[int] | None = None, words: frozenset[str] | None = None
) -> dict[str, str]:
    """Map each name bound by an import anywhere in the file to its dotted target.

    `import torch as T` -> {"T": "torch"}; `from torch import nn` -> {"nn": "torch.nn"};
    `import torch.nn` binds "torch". Relative imports keep their leading dots.
    `lines`: the lines holding the word `import` (ascending), if known: statements
    that span none of them are skipped unread. `words`: the words of the file's text
    (`FileContext.words`), if known.
    """
    aliases: dict[str, str] = {}
    star = False
    todo: list[ast.stmt] = list(tree.body)
    while todo:
        stmt = todo.pop()
        if lines is not None and not spans_a_line(stmt, lines):
            continue
        if isinstance(stmt, ast.Import):
            for alias in stmt.names:
                if alias.asname:
                    aliases[alias.asname] = alias.name
                else:
                    top = alias.name.split(".", 1)[0]
                    aliases[top] = top
        elif isinstance(stmt, ast.ImportFrom):
            base = "." * stmt.level + (stmt.module or "")
            for alias in stmt.names:
                if alias.name != "*":
                    sep = "" if not stmt.module else "."
                    aliases[alias.asname or alias.name] = base + sep + alias.name
                else:
                    star = True
        else:
            # imports inside functions, classes, if/try/match blocks count too
            todo.extend(child_statements(stmt))
    if star:
        aliases.update(_star_conventions(tree, aliases, words))
    return aliases


def _star_conventions(
    tree: ast.Module, aliases: dict[str, str], words: frozenset[str] | None = None
) -> dict[str, str]:
    """`F` -> torch.nn.functional (library.toml [imports]) for the conventional names the
    file uses but never binds: only a star import (`from models import *`) can bind them."""
    from torchdoctor.check.analysis.torch_api import STAR_CONVENTIONS

    wanted = {name for name in STAR_CONVENTIONS if name not in aliases}
    if words is not None:
        wanted &= words  # a name the text never spells is no `Name` of the tree
    if not wanted:
        return {}
    used: set[str] = set()
    for node in walk(tree):
        if isinstance(node, ast.Name) and node.id in wanted:
            if not isinstance(node.ctx, ast.Load):
                wanted.discard(node.id)  # bound here: whatever it is, it is not the convention
            used.add(node.id)
        elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            wanted.discard(node.name)
        elif isinstance(node, ast.arg):
            wanted.discard(node.arg)
        elif isinstance(node, ast.ExceptHandler | ast.MatchAs | ast.MatchStar) and node.name:
            wanted.discard(node.name)
    return {name: STAR_CONVENTIONS[name] for name in wanted & used}
