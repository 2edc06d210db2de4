"""Machine formats for CI: SARIF 2.1.0 (code scanning) and GitHub workflow annotations."""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any, TextIO

from torchdoctor import __version__
from torchdoctor.catalog import RuleInfo, catalog
from torchdoctor.check.engine import FileResult
from torchdoctor.check.lines import row_col
from torchdoctor.check.rule import Finding

SARIF_SCHEMA = "https://json.schemastore.org/sarif-2.1.0.json"
HOMEPAGE = "https://torchdoctor.readthedocs.io/"
# severity -> SARIF result level / GitHub annotation command
_SARIF_LEVEL = {"error": "error", "warning": "warning", "info": "note"}
_GITHUB_LEVEL = {"error": "error", "warning": "warning", "info": "notice"}


def repo_path(path: str) -> str:
    """`path` as a forward-slash path relative to the working folder when inside it."""
    p = Path(path)
    if p.is_absolute():
        try:
            p = p.relative_to(Path.cwd())
        except ValueError:
            return p.as_posix()
    return p.as_posix().removeprefix("./")


def cell_prefix(result: FileResult, finding: Finding) -> str:
    """`cell 3, line 2, column 5: ` for a notebook finding; '' for a .py file."""
    cell = result.cell_of(finding.line)
    if cell is None:
        return ""
    return f"cell {cell}, line {result.display_line(finding.line)}, column {finding.column}: "


# -- SARIF --------------------------------------------------------------------------------
def _rule_descriptor(info: RuleInfo) -> dict[str, Any]:
    body = info.doc.split("\n", 1)[1].strip() if "\n" in info.doc else info.doc
    return {
        "id": info.code,
        "name": info.name,
        "shortDescription": {"text": info.summary},
        "fullDescription": {"text": body or info.summary},
        "help": {"text": info.doc, "markdown": f"# {info.code} {info.name}\n\n{info.doc}"},
        "helpUri": info.url,
        "defaultConfiguration": {"level": _SARIF_LEVEL[info.severity.value]},
        "properties": {
            "tags": ["torchdoctor", info.category],
            "fix": info.fix.value,
        },
    }


def _artifact(path: str) -> dict[str, Any]:
    rel = repo_path(path)
    if Path(rel).is_absolute():
        return {"uri": Path(rel).as_uri()}
    return {"uri": rel, "uriBaseId": "%SRCROOT%"}


def _region_of_offsets(source: str, start: int, end: int) -> dict[str, int]:
    (line, col), (end_line, end_col) = row_col(source, start), row_col(source, end)
    return {"startLine": line, "startColumn": col, "endLine": end_line, "endColumn": end_col}


def _sarif_result(
    result: FileResult, finding: Finding, index: dict[str, int], entries: dict[str, RuleInfo]
) -> dict[str, Any]:
    info = entries.get(finding.code)
    level = _SARIF_LEVEL[info.severity.value] if info else "error"
    location: dict[str, Any] = {"artifactLocation": _artifact(result.display_path)}
    notebook = result.cell_of(finding.line) is not None
    if not notebook:  # a notebook's lines are not lines of its JSON file
        location["region"] = {
            "startLine": finding.line,
            "startColumn": finding.column,
            "endLine": finding.end_line,
            "endColumn": finding.end_column,
        }
    out: dict[str, Any] = {
        "ruleId": finding.code,
        "level": level,
        "message": {"text": cell_prefix(result, finding) + finding.message},
        "locations": [{"physicalLocation": location}],
    }
    if finding.code in index:
        out["ruleIndex"] = index[finding.code]
    if finding.fix is not None and finding.fix.edits and not notebook and result.source:
        source = result.source
        out["fixes"] = [
            {
                "description": {"text": finding.fix.message},
                "artifactChanges": [
                    {
                        "artifactLocation": _artifact(result.display_path),
                        "replacements": [
                            {
                                "deletedRegion": _region_of_offsets(source, e.start, e.end),
                                "insertedContent": {"text": e.content},
                            }
                            for e in finding.fix.edits
                        ],
                    }
                ],
            }
        ]
    return out


def sarif_log(results: Sequence[FileResult]) -> dict[str, Any]:
    """The SARIF 2.1.0 log: every rule's metadata, then one result per finding."""
    entries = catalog()
    rules = [info for info in entries.values() if info.kind != "runtime"]
    index = {info.code: i for i, info in enumerate(rules)}
    root = Path.cwd().as_uri() + "/"
    return {
        "$schema": SARIF_SCHEMA,
        "version": "2.1.0",
        "runs": [
            {
                "tool": {
                    "driver": {
                        "name": "torchdoctor",
                        "version": __version__,
                        "semanticVersion": __version__,
                        "informationUri": HOMEPAGE,
                        "rules": [_rule_descriptor(info) for info in rules],
                    }
                },
                "originalUriBaseIds": {"%SRCROOT%": {"uri": root}},
                "columnKind": "unicodeCodePoints",
                "results": [
                    _sarif_result(r, f, index, entries) for r in results for f in r.findings
                ],
            }
        ],
    }


def write_sarif(results: Sequence[FileResult], out: TextIO) -> None:
    json.dump(sarif_log(results), out, indent=2)
    out.write("\n")


# -- GitHub workflow commands ---------------------------------------------------------------
def _escape_data(text: str) -> str:
    return text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")


def _escape_property(text: str) -> str:
    return _escape_data(text).replace(":", "%3A").replace(",", "%2C")


def write_github(results: Sequence[FileResult], out: TextIO) -> None:
    """`::warning file=…,line=…,col=…,endLine=…,endColumn=…,title=TD402::message` lines."""
    entries = catalog()
    for r in results:
        file = repo_path(r.display_path)
        for f in r.findings:
            info = entries.get(f.code)
            command = _GITHUB_LEVEL[info.severity.value] if info else "error"
            props = [f"file={_escape_property(file)}"]
            if r.cell_of(f.line) is None:
                props += [
                    f"line={f.line}",
                    f"col={f.column}",
                    f"endLine={f.end_line}",
                    f"endColumn={f.end_column}",
                ]
            props.append(f"title={f.code}")
            message = cell_prefix(r, f) + f.message
            if info is not None:
                message += f" ({info.name}; `torchdoctor rule {f.code}`)"
            out.write(f"::{command} {','.join(props)}::{_escape_data(message)}\n")
