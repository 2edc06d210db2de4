"""Per-file facts shared by every rule: source, tree, import aliases, positions."""

from __future__ import annotations

import ast
import bisect
import functools
import os
import re
from collections.abc import Callable, Collection, Iterable, Iterator
from typing import TYPE_CHECKING, TypeVar

from torchdoctor.check import line_search
from torchdoctor.check.findings import Edit, Finding, Fix, FixAvailability
from torchdoctor.check.import_aliases import collect_imports
from torchdoctor.check.lines import line_starts, split_lines
from torchdoctor.check.project import ProjectIndex
from torchdoctor.check.tree_walk import forget_walks

if TYPE_CHECKING:
    from torchdoctor.check.torch_pins import TorchCeiling

_T = TypeVar("_T")

# ast counts lines at \n, \r\n and \r only (str.splitlines also splits at \f, \x1c, ...).


# An identifier: it starts at a letter or underscore (`words` keeps "3d_conv" whole,
# which still holds every needle that starts with a letter)
IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def words_of(text: str) -> frozenset[str]:
    """Every run of word characters in `text` (ASCII ones, and any non-ASCII character),
    found by C-level byte translation: twice as fast as `IDENTIFIER` on big files. Each
    identifier of the code is one; "3d_conv" is kept whole."""
    return frozenset(line_search.word_characters(text).split())


@functools.cache
def _needle_plan(needle: str) -> tuple[str | None, bool]:
    """(the word of `needle` to look for among the file's words, or None; whether the
    text itself must then be searched too)."""
    if IDENTIFIER.fullmatch(needle):
        return needle, False
    pieces = IDENTIFIER.findall(needle)
    return (max(pieces, key=len) if pieces else None), True


def offsets(source: str, needle: str) -> Iterator[int]:
    """Where `needle` occurs in `source`, found with `str.find` (no overlaps)."""
    at = source.find(needle)
    while at >= 0:
        yield at
        at = source.find(needle, at + len(needle))


@functools.cache
def _last_names(names: frozenset[str]) -> frozenset[str]:
    """`torch.save` -> `save`: what an attribute call of one of `names` ends with."""
    return frozenset(name.rsplit(".", 1)[-1] for name in names)


class FileContext:
    """Everything a rule may ask about the file being checked."""

    def __init__(
        self,
        path: str,
        source: str,
        tree: ast.Module,
        project: ProjectIndex,
        *,
        target_version: tuple[int, int] | None = None,
        torch_ceiling: TorchCeiling | None = None,
    ) -> None:
        self.path = path
        self.source = source
        self.tree = tree
        self.project = project
        # The torch version the checked code targets (`target-version`, `--target-version`),
        # as (major, minor); None when not configured. Version-dependent rules read it.
        self.target_version = target_version
        # Without one: the newest torch the project's dependency pins allow (torch_pins.py);
        # None when they allow any newer torch too.
        self.torch_ceiling = torch_ceiling
        self._imports: dict[str, str] | None = None
        # Ancestors of the node being visited, outermost first (kept by the engine).
        self.stack: list[ast.AST] = []
        self.findings: list[Finding] = []
        self._line_starts: list[int] | None = None
        self._lines: list[str] | None = None
        self._shared: dict[str, object] = {}
        self._words: frozenset[str] | None = None
        self._word_text: str | None = None
        # what `holds` and `_in_a_word` answered: rules and analyses ask the same
        # needles again, and an absent one costs a pass over the text
        self._held: dict[str, bool] = {}
        self._in_words: dict[str, bool] = {}
        # for `lines_holding`: the words of each chunk of the text (when the engine
        # found them), and the words holding a piece of a needle
        self._chunks: line_search.Chunks | None = None
        self._holders: dict[str, frozenset[str]] = {}

    # -- names ------------------------------------------------------------
    @property
    def project_path(self) -> str:
        """The file's path inside the checked project (forward slashes), for rules that
        judge a file by its name; the path as given when it lies outside the root."""
        path = self.path.replace("\\", "/")
        if not self.project.root:
            return path
        root = self.project.root.replace("\\", "/").rstrip("/")
        if not path.startswith(root + "/"):
            # the working directory comes resolved; the path may run through a symlink
            path = os.path.realpath(self.path).replace("\\", "/")
            if not path.startswith(root + "/"):
                return self.path.replace("\\", "/")
        return path[len(root) + 1 :]

    @property
    def imports(self) -> dict[str, str]:
        """Name bound by an import -> its dotted target (see `collect_imports`); lazy."""
        if self._imports is None:
            lines = self.lines_holding(["import"])
            self._imports = collect_imports(self.tree, lines, self.words)
        return self._imports

    def qualname(self, node: ast.AST) -> str | None:
        """Dotted name of a Name/Attribute chain with import aliases resolved.

        `T.load` -> "torch.load" after `import torch as T`; `load` -> "torch.load"
        after `from torch import load`; `model.to` -> "model.to". Anything else: None.
        """
        # (asked for hundreds of thousands of nodes: exact classes, the parser makes no
        # subclasses; a bare name, the commonest, needs no join)
        if node.__class__ is ast.Name:
            name = node.id  # type: ignore[attr-defined]
            return self.imports.get(name, name)
        parts: list[str] = []
        while node.__class__ is ast.Attribute:
            parts.append(node.attr)  # type: ignore[attr-defined]
            node = node.value  # type: ignore[attr-defined]
        if node.__class__ is not ast.Name:
            return None
        parts.append(self.imports.get(node.id, node.id))  # type: ignore[attr-defined]
        return ".".join(reversed(parts))

    def call_name(self, node: ast.AST) -> str | None:
        """qualname of a call's callee, or None if `node` is not a plain call."""
        if isinstance(node, ast.Call):
            return self.qualname(node.func)
        return None

    def call_name_in(self, node: ast.Call, names: frozenset[str]) -> str | None:
        """`call_name(node)` when it is one of the dotted `names`, else None.

        Most calls are of none of them: the callee's own last name is tested first
        (`x.save(...)`, or a bare name imported as one of `names`), before resolving.
        """
        func = node.func
        if isinstance(func, ast.Attribute):
            if func.attr not in _last_names(names):
                return None
        elif not (isinstance(func, ast.Name) and self.imports.get(func.id) in names):
            return None
        name = self.qualname(func)
        return name if name in names else None

    @property
    def words(self) -> frozenset[str]:
        """Every word of the text, comments and strings included (one scan, shared by
        the trigger tests and the training-loop analysis)."""
        if self._words is None:
            self._words = words_of(self.source)
        return self._words

    def share_words(
        self, words: frozenset[str], word_text: str, chunks: line_search.Chunks | None = None
    ) -> None:
        """Take `words_of(self.source)`, its words joined by newlines and, if found, the
        words chunk by chunk, found by the caller (the engine reads them before the
        context exists)."""
        self._words, self._word_text, self._chunks = words, word_text, chunks

    def holds(self, needle: str) -> bool:
        """Whether `needle` occurs in the text.

        A needle absent from the text costs a pass over all of it; a needle made of word
        characters lies inside a word of `words`, whose distinct words are far shorter
        than the text, so they are searched first (for any other needle, its longest
        word: `.to(` cannot occur without `to`).
        """
        found = self._held.get(needle)
        if found is None:
            piece, whole = _needle_plan(needle)
            if piece is not None and not self._in_a_word(piece):
                found = False
            else:
                found = not whole or needle in self.source
            self._held[needle] = found
        return found

    def _may_hold(self, needle: str) -> bool:
        """False when the needle's longest word is no part of any word of the text."""
        piece = _needle_plan(needle)[0]
        return piece is None or self._in_a_word(piece)

    def _in_a_word(self, piece: str) -> bool:
        """Whether `piece` is part of a word of the text: a word itself (a set lookup),
        else a search of the distinct words, far shorter than the text."""
        found = self._in_words.get(piece)
        if found is None:
            found = self._in_words[piece] = piece in self.words or piece in self.word_text
        return found

    @property
    def word_text(self) -> str:
        """The distinct words of the text joined by newlines: a short text that holds
        every run of word characters of the source (a search there finds whether one
        holds a piece)."""
        if self._word_text is None:
            self._word_text = "\n".join(self.words)
        return self._word_text

    def call_needles(self, names: frozenset[str]) -> tuple[str, ...]:
        """What the text of a call `call_name_in(call, names)` accepts always holds, as a
        whole word: the callee's last name, or the local name an import binds to one of
        `names`."""
        aliases = [local for local, target in self.imports.items() if target in names]
        return (*_last_names(names), *aliases)

    def lines_holding(self, needles: Iterable[str]) -> list[int]:
        """The lines holding a needle, ascending, each once."""
        source, starts = self.source, self._starts()
        found: set[int] = set()
        needles = tuple(needles)
        if len(needles) > 1:
            needles = line_search.fewest_needles(frozenset(needles))
        # needles that start alike are searched together, by one pattern: a pass of
        # `re` stops at their first character only, and costs about one `str.find`
        groups: dict[str, list[str]] = {}
        for needle in needles:
            if needle and self._may_hold(needle):
                key = needle if "\n" in needle or "\r" in needle else needle[0]
                groups.setdefault(key, []).append(needle)
        for group in groups.values():
            if len(group) == 1:
                first = functools.partial(source.find, group[0])
            else:
                pattern = line_search.alternatives(tuple(sorted(group)))
                first = functools.partial(line_search.match_at, pattern, source)
            for start, end in self._spans_to_search(group):
                line_search.add_lines(found, starts, first, start, end)
        return sorted(found)

    def _spans_to_search(self, needles: list[str]) -> list[tuple[int, int]]:
        """Where in the text `needles` may be: the chunks (`line_search.Chunks`) with a
        word that holds the longest word of one of them, or the whole text."""
        chunks, whole = self._chunks, [(0, len(self.source))]
        if chunks is None or len(chunks.words) < line_search.FEWEST_CHUNKS:
            return whole
        holders: set[str] = set()
        for needle in needles:
            piece = _needle_plan(needle)[0]
            if piece is None or "\n" in needle or "\r" in needle:
                return whole
            words = self._holders.get(piece)
            if words is None:
                words = self._holders[piece] = line_search.words_holding(self.word_text, piece)
            holders |= words
        return chunks.spans(frozenset(holders))

    def lines_naming(self, names: Collection[str]) -> list[int]:
        """The lines where a name of `names` stands as a whole word, ascending. Many
        names (a stub's every function) cost one scan of the text, not one search each."""
        present = [name for name in names if name in self.words]
        if len(present) < 64:
            # lines holding a name as a substring (one C-level find per name), kept
            # where it is a whole identifier (`val` is not `value`)
            wanted, lines = frozenset(present), self.lines
            return [
                line
                for line in self.lines_holding(present)
                if not wanted.isdisjoint(IDENTIFIER.findall(lines[line - 1]))
            ]
        wanted, starts, found = frozenset(present), self._starts(), set()
        for match in IDENTIFIER.finditer(self.source):
            if match.group() in wanted:
                found.add(bisect.bisect_right(starts, match.start()))
        return sorted(found)

    # -- ancestry ---------------------------------------------------------
    def enclosing(self, *types: type[ast.AST]) -> ast.AST | None:
        """The innermost ancestor of one of `types`, or None."""
        for node in reversed(self.stack):
            if isinstance(node, types):
                return node
        return None

    def enclosing_function(self) -> ast.FunctionDef | ast.AsyncFunctionDef | None:
        node = self.enclosing(ast.FunctionDef, ast.AsyncFunctionDef)
        assert node is None or isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        return node

    def enclosing_class(self) -> ast.ClassDef | None:
        node = self.enclosing(ast.ClassDef)
        assert node is None or isinstance(node, ast.ClassDef)
        return node

    def shared(self, key: str, build: Callable[[FileContext], _T]) -> _T:
        """A per-file analysis that several rules use: built once, on first request.

        It lives on this context and goes with it, so nothing outlives the file (a
        module-level `WeakKeyDictionary[FileContext, X]` whose X refers back to the
        context never frees either); a `release()` method, if it has one, is called by
        `close()`. `key` names the analysis, e.g. "loops".
        """
        try:
            return self._shared[key]  # type: ignore[return-value]
        except KeyError:
            value = self._shared[key] = build(self)
            return value

    def built(self, key: str) -> object | None:
        """The shared analysis `key` if some rule has built it (see `shared`), else None."""
        return self._shared.get(key)

    def close(self) -> None:
        """Release the shared analyses: they and the syntax tree refer to each other,
        and such cycles are freed only by the cyclic garbage collector, which then walks
        every node of every tree (a quarter of a whole-tree run). After this, reference
        counting frees the tree as soon as the file is done."""
        for value in self._shared.values():
            release = getattr(value, "release", None)
            if release is not None:
                release()
        self._shared.clear()
        self.stack.clear()
        forget_walks()

    def targets_torch_at_least(self, major: int, minor: int) -> bool:
        """Whether the configured target torch version is known to be >= major.minor.

        False when no target version is configured: a rule that suggests an API only
        newer torch has should then assume the oldest supported torch may be in use.
        """
        return self.target_version is not None and self.target_version >= (major, minor)

    def torch_may_be_at_least(self, major: int, minor: int) -> bool:
        """Whether the code may run on torch `major.minor` or newer: the configured target
        version is that new, or (none configured) the project's pins allow such a version.
        True when neither says: today's torch."""
        if self.target_version is not None:
            return self.target_version >= (major, minor)
        return self.torch_ceiling is None or self.torch_ceiling.allows_at_least(major, minor)

    def is_module_class(self, cls: ast.ClassDef) -> bool:
        """Whether `cls` subclasses torch.nn.Module (through this file or the project)."""
        if cls.name in self.project.module_classes:
            return True
        for base in cls.bases:
            qual = self.qualname(base)
            if qual is None:
                continue
            if qual.startswith("torch.nn.") and qual.rsplit(".", 1)[-1][:1].isupper():
                return True
            if self.project.is_module_class_name(qual):
                return True
        return False

    # -- positions ----------------------------------------------------------
    @property
    def lines(self) -> list[str]:
        """Source lines without their line endings (index 0 is line 1)."""
        if self._lines is None:
            self._lines = split_lines(self.source)
        return self._lines

    def _starts(self) -> list[int]:
        if self._line_starts is None:
            self._line_starts = line_starts(self.source, self.lines)
        return self._line_starts

    def char_column(self, line: int, byte_col: int) -> int:
        """ast gives UTF-8 byte columns; convert to a character column (0-based)."""
        text = self.lines[line - 1] if 0 < line <= len(self.lines) else ""
        if text.isascii():
            return byte_col
        return len(text.encode("utf-8")[:byte_col].decode("utf-8", errors="replace"))

    def offset(self, line: int, byte_col: int) -> int:
        """Character offset into `source` of an ast (line, byte column) position."""
        return self._starts()[line - 1] + self.char_column(line, byte_col)

    def node_span(self, node: ast.AST) -> tuple[int, int]:
        """(start, end) character offsets of a node with positions."""
        start = self.offset(node.lineno, node.col_offset)  # type: ignore[attr-defined]
        end_line = node.end_lineno or node.lineno  # type: ignore[attr-defined]
        end_col = node.end_col_offset  # type: ignore[attr-defined]
        if end_col is None:
            end_col = node.col_offset  # type: ignore[attr-defined]
        return start, self.offset(end_line, end_col)

    def segment(self, node: ast.AST) -> str:
        """The exact source text of a node."""
        start, end = self.node_span(node)
        return self.source[start:end]

    def line_of_offset(self, offset: int) -> int:
        return bisect.bisect_right(self._starts(), offset)

    def line_offset(self, line: int) -> int:
        """Character offset into `source` where `line` (1-based) starts."""
        return self._starts()[line - 1]

    # -- fixes ----------------------------------------------------------------
    def replace(self, node: ast.AST, content: str) -> Edit:
        start, end = self.node_span(node)
        return Edit(start, end, content)

    def insert_after(self, node: ast.AST, content: str) -> Edit:
        _, end = self.node_span(node)
        return Edit(end, end, content)

    @staticmethod
    def fix(message: str, *edits: Edit, safe: bool = True) -> Fix:
        return Fix(
            edits=tuple(edits),
            applicability=FixAvailability.SAFE if safe else FixAvailability.UNSAFE,
            message=message,
        )

    # -- findings ---------------------------------------------------------------
    def add_finding(
        self,
        code: str,
        node: ast.AST,
        message: str,
        *,
        fix: Fix | None = None,
        hint: str | None = None,
    ) -> None:
        line = getattr(node, "lineno", 1)
        col = getattr(node, "col_offset", 0)
        end_line = getattr(node, "end_lineno", None) or line
        end_col = getattr(node, "end_col_offset", None)
        if end_col is None:
            end_col = col
        noqa = {line, end_line}
        # A noqa comment on the first or last line of the enclosing simple statement counts.
        for anc in reversed([*self.stack, node]):
            if isinstance(anc, ast.stmt):
                if _is_simple_statement(anc):
                    noqa.update((anc.lineno, anc.end_lineno or anc.lineno))
                break
        self.findings.append(
            Finding(
                code=code,
                message=message,
                line=line,
                column=self.char_column(line, col) + 1,
                end_line=end_line,
                end_column=self.char_column(end_line, end_col) + 1,
                fix=fix,
                hint=hint,
                noqa_lines=tuple(sorted(noqa)),
            )
        )


_COMPOUND = (
    ast.FunctionDef,
    ast.AsyncFunctionDef,
    ast.ClassDef,
    ast.If,
    ast.For,
    ast.AsyncFor,
    ast.While,
    ast.With,
    ast.AsyncWith,
    ast.Try,
)


def _is_simple_statement(node: ast.stmt) -> bool:
    if isinstance(node, _COMPOUND):
        return False
    return not hasattr(ast, "Match") or not isinstance(node, ast.Match)
