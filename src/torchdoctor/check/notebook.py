"""Jupyter notebooks as one virtual Python module, and back.

The code cells are joined into one module that rules check like any file.
IPython syntax that is not Python (`%magic`, `!shell`, `obj?`, the `%%time` line of
a cell magic whose body is Python, whole cells of other `%%` magics such as `%%bash`)
is blanked line by line so every line keeps its number; a comment line
marks where one cell ends and the next begins, so that after `--fix` the new
code of each cell can be split out again and written back into the notebook
JSON with everything else (metadata, outputs, other cells) untouched.
"""

from __future__ import annotations

import ast
import difflib
import json
import keyword
import re
from dataclasses import dataclass, field
from typing import Any

from torchdoctor.check.lines import split_lines
from torchdoctor.errors import TorchDoctorError

# Ends every cell in the virtual module (a comment: it changes nothing for Python).
CELL_BREAK = "# %% torchdoctor cell break"
# IPython-only lines: `%time x`, `!pip install`, `?obj`, `obj?`, `files = !ls`, `x = %env`.
# Also IPython's automagic: a shell alias or line magic written without its `%`
# (`ls -l data/`, `cd code`, `pip install x`), when the word is not used as Python.
_MAGIC = re.compile(
    r"^\s*(?:[%!?]|[\w.]+\?{1,2}\s*$|[\w.,\s]+=\s*[%!]\w"
    r"|(?:ls|ll|cd|cat|cp|mv|rm|mkdir|rmdir|pwd|pip|conda|mamba|env|clear|less|more|man)"
    r"(?:[ \t]+[^=\s(\[,:)][^\n]*)?$)",
)
_INDENT = re.compile(r"^[ \t]*")
# Cell magics whose body IPython runs as Python: only their `%%` line is not Python.
# Any other (`%%bash`, `%%writefile`, `%%html`, ...) makes the whole cell something else.
PYTHON_CELL_MAGICS = frozenset({"time", "timeit", "capture", "prun", "debug", "memit"})
_CELL_MAGIC = re.compile(r"\s*%%(\w*)")
CELL_TYPES = frozenset({"code", "markdown", "raw"})


class NotebookError(TorchDoctorError):
    """A file ending in .ipynb that is not a readable notebook."""


@dataclass
class Cell:
    index: int  # position in the notebook's "cells" list (0-based)
    code: str  # the cell's source as one string
    lines: list[str]  # the cell's lines as they appear in the virtual module
    magic_lines: dict[int, str] = field(default_factory=dict)  # line index -> original text


@dataclass
class Notebook:
    data: dict[str, Any]  # the parsed JSON, written back with only cell sources changed
    cells: list[Cell]  # the code cells
    source: str  # the virtual module
    cell_lines: list[tuple[int, int]]  # virtual line -> (cell number, line in cell), 1-based
    indent: int | None  # the JSON layout to write back with
    ensure_ascii: bool
    final_newline: bool
    warnings: list[str] = field(default_factory=list)  # malformed cells, by cell number
    # cells that are not Python, left out: (virtual line, column, the SyntaxError's message)
    broken: list[tuple[int, int, str]] = field(default_factory=list)


def read_notebook(text: str) -> Notebook:
    """Parse notebook JSON into its virtual module; NotebookError if it is not one."""
    try:
        data = json.loads(text)
    except (json.JSONDecodeError, RecursionError) as exc:
        raise NotebookError(f"not valid notebook JSON: {exc}") from None
    raw_cells = data.get("cells") if isinstance(data, dict) else None
    if not isinstance(raw_cells, list):
        raise NotebookError("not a Jupyter notebook: no 'cells' list")

    cells: list[Cell] = []
    virtual: list[str] = []
    cell_lines: list[tuple[int, int]] = []
    warnings: list[str] = []
    for index, raw in enumerate(raw_cells):
        problem = _malformed(raw)
        if problem:
            warnings.append(f"cell {index + 1} {problem}; not checked")
            continue
        if raw["cell_type"] != "code":
            continue
        code = _join_source(raw["source"])
        assert code is not None  # _malformed checked it
        cell = Cell(index, code, split_lines(code) if code else [])
        _blank_ipython(cell)
        cells.append(cell)
        virtual.extend(cell.lines)
        cell_lines.extend((index + 1, n) for n in range(1, len(cell.lines) + 1))
        virtual.append(CELL_BREAK)
        cell_lines.append((index + 1, len(cell.lines) + 1))

    broken = _leave_out_broken_cells(cells, virtual)
    match = re.match(r"\{\s*?\n([ \t]*)\S", text)
    return Notebook(
        data=data,
        cells=cells,
        source="\n".join(virtual) + ("\n" if virtual else ""),
        cell_lines=cell_lines,
        indent=len(match.group(1)) if match else None,
        ensure_ascii=text.isascii() and "\\u" in text,
        final_newline=text.endswith("\n"),
        warnings=warnings,
        broken=broken,
    )


def _leave_out_broken_cells(cells: list[Cell], virtual: list[str]) -> list[tuple[int, int, str]]:
    """Blank, in `virtual` too, the cells that do not parse on their own, when the module
    does not parse: Jupyter compiles each cell apart, so one cell that is not Python (a
    BibTeX citation, an exercise's `lr = `) fails alone and the others still run.
    Returns where each one fails (virtual line, column, message)."""
    try:
        ast.parse("\n".join(virtual))
        return []
    except (SyntaxError, ValueError, MemoryError, RecursionError):
        pass
    broken: list[tuple[int, int, str]] = []
    imported = _import_names("\n".join(virtual))
    start = 0  # virtual lines before the cell
    for cell in cells:
        try:
            ast.parse("\n".join(cell.lines))
        except SyntaxError as exc:
            broken.append((start + (exc.lineno or 1), exc.offset or 1, exc.msg))
            cell.magic_lines.update(
                (i, line) for i, line in enumerate(cell.lines) if i not in cell.magic_lines
            )
            # what the cell may bind or change is unknown after it, not unbound: when it
            # runs, `net = Net(...)` there binds `net` (an empty line would leave `net`
            # unbound, and the paths that skip a later `if gpu: net.cuda()` would seem to
            # raise NameError)
            cell.lines = _stand_in(cell, imported)
            virtual[start : start + len(cell.lines)] = cell.lines
        except (ValueError, MemoryError, RecursionError):
            pass  # the whole module's parse tells
        start += len(cell.lines) + 1  # and the cell break
    return broken


# An `import x` / `from x import y` line (one that parses alone is at the top level: a
# cell that does not parse keeps it, for the modules it binds).
_IMPORT_LINE = re.compile(r"^[ \t]*(?:import|from)[ \t][^\n]*$", re.M)
# Where a line of code binds names: `a, b = `, `x += `, `for i in`, `def f`, `as h`.
_BINDING = re.compile(
    r"^([^=#\n]*?)(?:[-+*/%@&|^]|//|\*\*|>>|<<)?=(?!=)|\bfor\b([^\n]*?)\bin\b"
    r"|\b(?:def|class|as|import)[ \t]+(\w+)|\bimport\b([^\n#]*)",
    re.M,
)
_NAME = re.compile(r"(?<![\w.])[A-Za-z_]\w*")
_COMMENT = re.compile(r"#[^\n]*")
# a name whose attribute the code uses: `net.cuda()`, `net.fc = ...` may change `net`
_ATTRIBUTE_ROOT = re.compile(r"(?<![\w.])([A-Za-z_]\w*)[ \t]*\.")


def _stand_in(cell: Cell, imported: frozenset[str]) -> list[str]:
    """The lines that stand in for a cell that does not parse: its own top-level import
    lines (each parses alone: the modules it binds), and on its first other line one
    statement binding what else it may bind or change to an unknown value."""
    lines = [line if _IMPORT_LINE.match(line) and _parses(line) else "" for line in cell.lines]
    own = _import_names("\n".join(line for line in lines if line))
    rest = "\n".join(line for line, kept in zip(cell.lines, lines, strict=True) if not kept)
    names = [n for n in _names_touched(rest, imported) if n not in own]
    free = next((i for i, line in enumerate(lines) if not line), None)
    if names and free is not None:
        lines[free] = " = ".join([*names, "object()"])
    return lines


def _import_names(text: str) -> frozenset[str]:
    """The names the import lines of `text` bind (`import torch.nn as nn`: nn; `from x
    import a, b`: a, b; `import os.path`: os), each line read alone."""
    names: set[str] = set()
    for match in _IMPORT_LINE.finditer(text):
        try:
            tree = ast.parse(match.group().strip())
        except (SyntaxError, ValueError):
            continue
        for node in tree.body:
            if isinstance(node, ast.Import | ast.ImportFrom):
                names.update((a.asname or a.name).split(".")[0] for a in node.names)
    return frozenset(names)


def _parses(line: str) -> bool:
    try:
        ast.parse(line)
    except (SyntaxError, ValueError):
        return False
    return True


def _names_touched(code: str, imported: frozenset[str]) -> list[str]:
    """The names a cell that does not parse may bind or change when it runs: those it
    assigns, loops over, defines or imports, and the objects whose attributes it uses
    (except the modules the notebook imports). An over-approximation: each becomes
    unknown after the cell, which only ever makes a rule quieter."""
    found: set[str] = set()
    code = _COMMENT.sub("", code)  # (prose: "the reviews_ints list." names nothing)
    for match in _BINDING.finditer(code):
        for part in match.groups():
            if part:
                found.update(_NAME.findall(part))
    found.update(n for n in _ATTRIBUTE_ROOT.findall(code) if n not in imported)
    return sorted(n for n in found if not keyword.iskeyword(n) and not keyword.issoftkeyword(n))


def _malformed(raw: object) -> str | None:
    """What makes a cell unusable (nbformat 4 requires an object with these), or None."""
    if not isinstance(raw, dict):
        return f"is a JSON {type(raw).__name__}, not an object"
    kind = raw.get("cell_type")
    if kind not in CELL_TYPES:
        return "has no cell_type" if kind is None else f"has an unknown cell_type {kind!r}"
    if "source" not in raw:
        return "has no 'source'"
    if _join_source(raw["source"]) is None:
        return "has a 'source' that is neither text nor a list of lines"
    return None


def _join_source(source: object) -> str | None:
    if isinstance(source, str):
        return source
    if isinstance(source, list) and all(isinstance(s, str) for s in source):
        return "".join(source)
    return None


def _blank_ipython(cell: Cell) -> None:
    """Replace IPython-only lines by `pass` (same indent) so the cell parses as Python."""
    lines = cell.lines
    if not lines:
        return
    first = 0
    magic = _CELL_MAGIC.match(lines[0])
    if magic:
        cell.magic_lines[0] = lines[0]
        lines[0] = ""
        if magic.group(1) not in PYTHON_CELL_MAGICS:
            # %%bash, %%writefile, ...: the body is not Python at all
            cell.magic_lines.update(enumerate(lines[1:], start=1))
            cell.lines = [""] * len(lines)
            return
        first = 1  # %%time and kin: the body is Python, line magics and all
    body = lines[first:]
    if not any(_MAGIC.match(line) for line in body):
        return
    try:
        ast.parse("\n".join(body))
        return  # valid Python already: a line such as `% b` continues an expression
    except (SyntaxError, ValueError):
        pass
    continued = False  # the line before was a magic's, ending in `\\`: this one goes on
    for i, line in enumerate(lines[first:], start=first):
        if continued or _MAGIC.match(line):
            cell.magic_lines[i] = line
            # (IPython joins a magic's backslash-continued lines into one command)
            lines[i] = "" if continued else _INDENT.match(line).group() + "pass"  # type: ignore[union-attr]
            continued = line.rstrip().endswith("\\")


def cell_codes(notebook: Notebook, virtual: str) -> list[str]:
    """Each code cell's code in a (fixed) virtual module, IPython lines restored."""
    lines = split_lines(virtual)
    chunks: list[list[str]] = [[]]
    for line in lines:
        if line == CELL_BREAK:
            chunks.append([])
        else:
            chunks[-1].append(line)
    chunks = chunks[: len(notebook.cells)]
    if len(chunks) != len(notebook.cells):
        raise NotebookError("a fix removed a cell boundary; the notebook was not changed")
    out = []
    for cell, new_lines in zip(notebook.cells, chunks, strict=True):
        if new_lines == cell.lines:
            out.append(cell.code)
            continue
        restored = list(new_lines)
        if cell.magic_lines:
            # Map unchanged lines of the new code back to the old ones to restore magics.
            matcher = difflib.SequenceMatcher(None, cell.lines, new_lines, autojunk=False)
            for old_start, new_start, size in matcher.get_matching_blocks():
                for k in range(size):
                    original = cell.magic_lines.get(old_start + k)
                    if original is not None:
                        restored[new_start + k] = original
        out.append("\n".join(restored))
    return out


def write_notebook(notebook: Notebook, virtual: str) -> str:
    """The notebook JSON with the code cells of `virtual`; everything else unchanged."""
    cells = notebook.data["cells"]
    for cell, code in zip(notebook.cells, cell_codes(notebook, virtual), strict=True):
        if code == cell.code:
            continue
        raw = cells[cell.index]
        if isinstance(raw.get("source"), list):
            raw["source"] = code.splitlines(keepends=True)
        else:
            raw["source"] = code
    text = json.dumps(notebook.data, indent=notebook.indent, ensure_ascii=notebook.ensure_ascii)
    return text + "\n" if notebook.final_newline else text


def cell_diffs(notebook: Notebook, virtual: str, path: str) -> list[str]:
    """Unified diff lines, one hunk set per changed cell."""
    out: list[str] = []
    for cell, code in zip(notebook.cells, cell_codes(notebook, virtual), strict=True):
        if code == cell.code:
            continue
        out.extend(
            difflib.unified_diff(
                (cell.code + "\n").splitlines(keepends=True),
                (code + "\n").splitlines(keepends=True),
                fromfile=f"a/{path}:cell {cell.index + 1}",
                tofile=f"b/{path}:cell {cell.index + 1}",
            )
        )
    return out


# "line 12" in a finding's message cites a line of the same file (other files are "path:12")
_CITED_LINE = re.compile(r"\bline (\d+)\b")


def cite_cells(message: str, cell_lines: list[tuple[int, int]]) -> str:
    """A message's "line N" (a virtual-module line) as "cell K:M", as the finding's own
    location reads in a notebook."""

    def cell(match: re.Match[str]) -> str:
        line = int(match.group(1))
        if not 0 < line <= len(cell_lines):
            return match.group()
        number, in_cell = cell_lines[line - 1]
        return f"cell {number}:{in_cell}"

    return _CITED_LINE.sub(cell, message)
