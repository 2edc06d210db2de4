"""The check engine: find files, parse each once, run every rule in one walk."""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.config import Settings, matches
from torchdoctor.check.context import FileContext
from torchdoctor.check.discovery import SOURCE_SUFFIXES, discover
from torchdoctor.check.line_search import Chunks
from torchdoctor.check.lines import NEWLINE, as_lf, split_lines
from torchdoctor.check.parse import parse_module
from torchdoctor.check.parsed_trees import take_for_check
from torchdoctor.check.project import ProjectIndex
from torchdoctor.check.registry import rule_classes
from torchdoctor.check.rule import Finding, Rule
from torchdoctor.check.source_text import decode_source
from torchdoctor.check.tree_walk import (
    HOLDS_STATEMENTS,
    OPERATOR_TYPES,
    STATEMENTS,
    child_fields,
    spans_a_line,
)

if TYPE_CHECKING:
    from torchdoctor.check.notebook import Notebook
    from torchdoctor.check.torch_pins import TorchCeiling

__all__ = [
    "SOURCE_SUFFIXES",
    "FileResult",
    "RunOptions",
    "check_source",
    "check_text",
    "decode_source",
    "discover",
    "rules_for",
]

# Suppression comments, flake8 style: "noqa" alone or "noqa: TD101, TD204" (other codes ignored)
NOQA_COMMENT = re.compile(
    r"#\s*noqa(?::[\s]?(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?", re.I
)
_FILE_NOQA = re.compile(
    r"^\s*#\s*torchdoctor:\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?\s*$",
    re.I | re.M,
)
_CODE = re.compile(r"[A-Z]+[0-9]+", re.I)


@dataclass
class FileResult:
    """The outcome for one checked file."""

    path: str
    findings: list[Finding] = field(default_factory=list)
    source: str | None = None  # the checked text after fixes (a notebook's virtual module)
    original: str | None = None  # the text before fixes, when fixes changed it
    fixed: int = 0  # fixes applied by --fix
    # For notebooks: virtual line (1-based) -> (cell number, line in cell), both 1-based.
    cell_lines: list[tuple[int, int]] | None = None
    notebook: Notebook | None = None  # the parsed notebook, for write-back and diffs

    def cell_of(self, line: int) -> int | None:
        """The notebook cell (1-based) holding virtual `line`, or None for a .py file."""
        if self.cell_lines and 0 < line <= len(self.cell_lines):
            return self.cell_lines[line - 1][0]
        return None

    @property
    def display_path(self) -> str:
        return self.path

    def display_line(self, line: int) -> int:
        if self.cell_lines and 0 < line <= len(self.cell_lines):
            return self.cell_lines[line - 1][1]
        return line

    def location(self, finding: Finding) -> str:
        """`12:5`, or `cell 3:2:5` in a notebook."""
        if self.cell_lines and 0 < finding.line <= len(self.cell_lines):
            cell, line = self.cell_lines[finding.line - 1]
            return f"cell {cell}:{line}:{finding.column}"
        return f"{finding.line}:{finding.column}"


# -- reading ------------------------------------------------------------------------
def syntax_error_finding(message: str, line: int = 1, column: int = 1) -> Finding:
    return Finding(
        code="TD001",
        message=message,
        line=max(line, 1),
        column=max(column, 1),
        end_line=max(line, 1),
        end_column=max(column, 1),
    )


def _newer_syntax_note(exc: SyntaxError) -> str:
    """Python 3.12 f-strings may reuse their quotes inside (PEP 701): valid code the
    grammar of an older interpreter, which torchdoctor parses with, rejects."""
    if sys.version_info >= (3, 12) or not (exc.msg or "").startswith("f-string"):
        return ""
    running = f"{sys.version_info.major}.{sys.version_info.minor}"
    return (
        f" (if the f-string reuses its quotes inside, it is valid Python 3.12 that Python "
        f"{running}, which torchdoctor runs on, cannot parse: run torchdoctor under "
        "Python 3.12 or newer to check this file)"
    )


# -- checking one source text -----------------------------------------------------------
def select_rules(enabled: frozenset[str]) -> list[type[Rule]]:
    return [rule for rule in rule_classes() if rule.code in enabled]


def check_source(
    source: str,
    path: str,
    rules: Sequence[type[Rule]],
    project: ProjectIndex | None = None,
    *,
    target_version: tuple[int, int] | None = None,
    torch_ceiling: TorchCeiling | None = None,
    tree: ast.Module | None = None,
) -> list[Finding]:
    """Run `rules` on one source text; never raises for bad input or a broken rule.

    `tree` may be passed when the caller already parsed `source` (the flake8 plugin).
    """
    # The words of the text, found once and shared with the context (the triggers below,
    # the rules). The regex is slow on long files: first a test any spelling of
    # "torchdoctor: noqa" passes, on the distinct words (far shorter than the text; both
    # words are whole words there, and flake8's own noqa comments are common).
    chunks = Chunks(source)
    words = chunks.all_words
    word_text = "\n".join(words)
    lowered = word_text.lower()
    if "qa" in lowered and "torchdoctor" in lowered and _FILE_NOQA.search(as_lf(source)):
        file_noqa = _file_noqa_codes(source)
        if file_noqa is None:
            return []
        rules = [r for r in rules if r.code not in file_noqa]
    try:
        if tree is None:
            # a tree a sibling read or the project index parsed serves (parsed once)
            tree = take_for_check(path, source) or parse_module(source, path)
    except SyntaxError as exc:
        return [
            syntax_error_finding(
                f"SyntaxError: {exc.msg}{_newer_syntax_note(exc)}; the file was not checked",
                exc.lineno or 1,
                exc.offset or 1,
            )
        ]
    except (ValueError, MemoryError, RecursionError) as exc:
        # the parser's stack overflow is a MemoryError with no message
        reason = str(exc) or f"{type(exc).__name__} (nested too deeply for the parser?)"
        return [syntax_error_finding(f"cannot parse: {reason}; the file was not checked")]
    project = project if project is not None else build_project([source])
    ctx = FileContext(
        path, source, tree, project, target_version=target_version, torch_ceiling=torch_ceiling
    )
    ctx.share_words(words, word_text, chunks)
    # a trigger that several rules share (`backward`, `forward`) is looked for once
    present: dict[str, bool] = {}

    def triggered(rule: type[Rule]) -> bool:
        for trigger in rule.triggers:
            found = present.get(trigger)
            if found is None:
                found = present[trigger] = ctx.holds(trigger)
            if found:
                return True
        return not rule.triggers

    active = [cls(ctx) for cls in rules if triggered(cls)]
    try:
        if active:
            _run_rules(ctx, active)
    finally:
        ctx.close()
    return apply_noqa(ctx.findings, source)


def _run_rules(ctx: FileContext, active: list[Rule]) -> None:
    dispatch: dict[type[ast.AST], list[tuple[Rule, Callable[[ast.AST], None]]]] = {}
    for rule in active:
        # read from the instance: a rule may narrow its node types for one file (_file_gate)
        for node_type in rule.node_types:
            dispatch.setdefault(node_type, []).append((rule, rule.visit))
    broken: set[str] = set()

    def fail(rule: Rule, exc: BaseException, node: ast.AST | None) -> None:
        broken.add(rule.code)
        # new lists: a walk reading the old one goes on unchanged (no copy per node)
        for node_type, handlers in dispatch.items():
            dispatch[node_type] = [h for h in handlers if h[0] is not rule]
        ctx.findings.append(
            Finding(
                code="TD900",
                message=f"internal error in rule {rule.code} ({rule.name}): "
                f"{type(exc).__name__}: {exc}; please report this",
                line=getattr(node, "lineno", 1),
                column=getattr(node, "col_offset", 0) + 1,
                end_line=getattr(node, "lineno", 1),
                end_column=getattr(node, "col_offset", 0) + 1,
            )
        )

    stack = ctx.stack
    lines = _needle_lines(ctx, active)
    fields_of = child_fields(want_operators=any(t in OPERATOR_TYPES for t in dispatch))
    # Nodes with no children and no visitor (names, constants, contexts) are not entered;
    # nor are the non-node values a field may hold (None in `{**d}` keys, `global` names).
    skip: set[type] = {cls for cls, fields in fields_of.items() if not fields} - dispatch.keys()
    skip |= {type(None), str, bytes, int, float, complex, bool, type(...)}

    def walk(tree: ast.AST) -> None:
        """Visit every node once, depth first, keeping `stack` = the node's ancestors
        (a node goes on it before its first child is visited).

        Recursive: a call per node costs less than keeping a list of nodes to visit and
        markers for leaving them. The parser builds no tree deeper than the recursion
        limit set below allows (see there).
        """
        enter, leave = stack.append, stack.pop
        handlers_of, fields_in = dispatch.get, fields_of.get
        # (locals: looked up for every node)
        holders = HOLDS_STATEMENTS if lines is not None else frozenset()
        statements, spans, spanned = STATEMENTS, spans_a_line, lines or []

        def visit(node: ast.AST) -> None:
            cls = node.__class__
            handlers = handlers_of(cls)
            if handlers:
                for rule, visit_node in handlers:
                    try:
                        visit_node(node)
                    except Exception as exc:  # reported as TD900, the run goes on
                        fail(rule, exc, node)
            fields = fields_in(cls)
            if fields is None:  # a node class this Python's ast module does not list
                fields = node._fields
            entered = False
            if cls not in holders:
                for name in fields:
                    value = getattr(node, name, None)
                    if value.__class__ is list:
                        for item in value:
                            if item.__class__ not in skip:
                                if not entered:
                                    enter(node)
                                    entered = True
                                visit(item)
                    elif value.__class__ not in skip:
                        if not entered:
                            enter(node)
                            entered = True
                        visit(value)  # type: ignore[arg-type]  # a node: see `skip`
            else:  # leave out the statements no visitor can report in
                for name in fields:
                    value = getattr(node, name, None)
                    for item in value if value.__class__ is list else (value,):
                        if item.__class__ not in skip and (
                            item.__class__ not in statements or spans(item, spanned)
                        ):
                            if not entered:
                                enter(node)
                                entered = True
                            visit(item)  # type: ignore[arg-type]  # a node: see `skip`
            if entered:
                leave()

        try:
            visit(tree)
        finally:
            # the function refers to itself (its cell): no cycle left holding the rules
            visit = None  # type: ignore[assignment]

    # The walk and the rules' own analyses in finish() recurse over the tree: any tree
    # the parser accepts (at the default limit) fits in this one.
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(max(limit, 20_000))
    try:
        if dispatch:
            try:
                walk(ctx.tree)
            except RecursionError:
                stack.clear()
                ctx.findings.append(
                    syntax_error_finding("the file is nested too deeply to check; it was skipped")
                )
        for rule in active:
            if rule.code in broken:
                continue
            try:
                rule.finish()
            except Exception as exc:
                fail(rule, exc, None)
    finally:
        sys.setrecursionlimit(limit)


def _needle_lines(ctx: FileContext, active: list[Rule]) -> list[int] | None:
    """The lines holding a needle or naming a word of a visiting rule, when every visiting
    rule names some (see `Rule.visit_needles`, `Rule.visit_words`); None when the whole
    tree must be walked."""
    needles: set[str] = set()
    words: set[str] = set()
    for rule in active:
        if rule.node_types:
            found = rule.visit_needles()
            named = rule.visit_words()
            if found is None and named is None:
                return None
            needles.update(found or ())
            words.update(named or ())
    lines = ctx.lines_holding(needles)
    if not words:
        return lines
    return sorted({*lines, *ctx.lines_naming(words)})


# -- suppression ----------------------------------------------------------------------
def _file_noqa_codes(source: str) -> frozenset[str] | None:
    """None: the whole file is suppressed; else the codes suppressed file-wide."""
    codes: set[str] = set()
    for match in _FILE_NOQA.finditer(as_lf(source)):
        if not match.group("codes"):
            return None
        codes.update(c.upper() for c in _CODE.findall(match.group("codes")))
    return frozenset(codes)


def noqa_map(source: str) -> dict[int, frozenset[str] | None]:
    """Line -> codes silenced there (None: all codes)."""
    result: dict[int, frozenset[str] | None] = {}
    if "noqa" not in source.lower():
        return result
    for lineno, line in enumerate(split_lines(source), start=1):
        if "#" not in line:
            continue
        match = NOQA_COMMENT.search(line)
        if match:
            codes = match.group("codes")
            result[lineno] = (
                None if not codes else frozenset(c.upper() for c in _CODE.findall(codes))
            )
    return result


def apply_noqa(findings: list[Finding], source: str) -> list[Finding]:
    if not findings:
        return []  # (most files: their comments are not read)
    silenced = noqa_map(source)
    if not silenced:
        return sorted(findings, key=finding_order)
    kept = []
    for finding in findings:
        if finding.code in ("TD001", "TD900"):
            kept.append(finding)
            continue
        lines = finding.noqa_lines or (finding.line, finding.end_line)
        if any(
            line in silenced and (silenced[line] is None or finding.code in silenced[line])  # type: ignore[operator]
            for line in lines
        ):
            continue
        kept.append(finding)
    return sorted(kept, key=finding_order)


def finding_order(f: Finding) -> tuple[int, int, str]:
    return (f.line, f.column, f.code)


# -- reading files ---------------------------------------------------------------------
def iter_sources(files: Iterable[Path]) -> Iterator[tuple[Path, str | None, Finding | None]]:
    """(path, text, None) or (path, None, TD001 finding) for each file."""
    for file in files:
        try:
            data = file.read_bytes()
        except OSError as exc:
            yield file, None, syntax_error_finding(f"cannot read file: {exc.strerror or exc}")
            continue
        try:
            yield file, decode_source(data), None
        except (UnicodeDecodeError, SyntaxError, LookupError) as exc:
            yield file, None, syntax_error_finding(f"cannot decode file: {exc}")


# -- a whole run ------------------------------------------------------------------------
MAX_FIX_PASSES = 10


@dataclass
class RunOptions:
    enabled: frozenset[str]
    fix: bool = False
    unsafe_fixes: bool = False
    diff: bool = False  # compute fixes but do not write them
    target_version: tuple[int, int] | None = None  # FileContext.target_version


def check_text(
    source: str,
    path: str,
    rules: Sequence[type[Rule]],
    project: ProjectIndex,
    options: RunOptions,
    torch_ceiling: TorchCeiling | None = None,
) -> tuple[list[Finding], str, int]:
    """Check one text; with fix/diff, fix until stable. `torch_ceiling`: what the
    project's pins allow (torch_pins.py), read when no target version is configured.

    Returns (findings left, final text, number of fixes applied).
    """
    from torchdoctor.check.fix import apply_edits

    def check(text: str) -> list[Finding]:
        return check_source(
            text,
            path,
            rules,
            project,
            target_version=options.target_version,
            torch_ceiling=torch_ceiling,
        )

    findings = check(source)
    if not (options.fix or options.diff):
        return findings, source, 0
    newline = first_newline(source)
    text = source
    total = 0
    for _ in range(MAX_FIX_PASSES):
        new_text, applied = apply_edits(text, findings, options.unsafe_fixes, newline=newline)
        if not applied:
            break
        text = new_text
        total += applied
        findings = check(text)
    return findings, text, total


def first_newline(source: str) -> str:
    """The file's line ending, judged by its first line (as ruff does); `\n` if none."""
    match = NEWLINE.search(source)
    return match.group() if match else "\n"


def rules_for(path: Path, settings: Settings, options: RunOptions) -> list[type[Rule]]:
    ignored = settings.ignored_for(path)
    return [
        rule
        for rule in select_rules(options.enabled)
        if not any(matches(rule.code, rule.group, sel) for sel in ignored)
    ]
