"""Parse a module into one `ast.Module`, big files piece by piece to bound the peak memory.

`ast.parse` first builds the whole tree in the C parser's arena and then converts it
into Python objects, so at its peak it holds two trees: about 160 bytes of memory per
byte of source, against about 75 for the Python tree it returns. A file of several
megabytes (generated code, vendored bundles) is therefore parsed in pieces of about
`PIECE_BYTES`, cut before top-level `def`, `class` and decorator lines, and the pieces'
statements joined into one module. Each piece is parsed at its real line numbers
(blank lines stand in for the code before it), so the tree is the one `ast.parse`
gives. A cut that is not a real statement boundary (inside a string or brackets)
leaves a piece that does not parse; then the whole file is parsed at once, as are
files below `CHUNKED_FROM_BYTES`.
"""

from __future__ import annotations

import ast
import itertools
import re

# Below this size the one-shot parse's peak does not matter (and is slightly faster).
CHUNKED_FROM_BYTES = 2_000_000
PIECE_BYTES = 256_000
# A line where a top-level definition starts: a place a piece may begin.
_TOP_LEVEL_DEFINITION = re.compile(r"^(?:(?:async[ \t]+)?def|class)\b|^@", re.M)


def parse_module(source: str, filename: str = "<unknown>") -> ast.Module:
    """`ast.parse(source, filename)`, with a lower peak memory on big sources."""
    if len(source) < CHUNKED_FROM_BYTES or "\r" in source:
        # (lone `\r` line ends would need their own line count; such files are rare)
        return ast.parse(source, filename=filename)
    pieces = _pieces(source)
    if len(pieces) < 2:
        return ast.parse(source, filename=filename)
    body: list[ast.stmt] = []
    line = 0  # lines before the current piece
    for piece in pieces:
        try:
            tree = ast.parse("\n" * line + piece, filename=filename)
        except (SyntaxError, ValueError, MemoryError, RecursionError):
            del body  # a false cut, or a real error: let the one-shot parse tell
            return ast.parse(source, filename=filename)
        body.extend(tree.body)
        line += piece.count("\n")
    return ast.Module(body=body, type_ignores=[])


def _pieces(source: str) -> list[str]:
    """`source` cut at top-level definitions into pieces of about PIECE_BYTES."""
    cuts = [0]
    for match in _TOP_LEVEL_DEFINITION.finditer(source):
        start = match.start()
        if start - cuts[-1] >= PIECE_BYTES and _starts_a_definition(source, start):
            cuts.append(start)
    cuts.append(len(source))
    return [source[a:b] for a, b in itertools.pairwise(cuts) if b > a]


def _starts_a_definition(source: str, start: int) -> bool:
    """No decorator line just above: a cut there would split a decorated definition."""
    if start == 0:
        return True
    previous_line_start = source.rfind("\n", 0, start - 1) + 1
    return not source.startswith("@", previous_line_start)
