"""The one catalogue of rule codes, shared by `check`, the guard and `explain`.

Static rules document themselves in their own files (`check/rules/`); the
codes that only the runtime raises, and the engine's own codes, are listed
here. Every code is stable and never reused.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

from torchdoctor.check.registry import rule_classes
from torchdoctor.check.rule import FixAvailability, Severity

DOCS_URL = "https://torchdoctor.readthedocs.io/en/latest/rules/{code}/"


@dataclass(frozen=True)
class RuleInfo:
    code: str
    name: str
    category: str
    severity: Severity
    fix: FixAvailability
    default_enabled: bool
    doc: str
    kind: str  # "static" (a check rule), "runtime" (guard/simulate/explain only), "engine"

    @property
    def summary(self) -> str:
        return self.doc.split("\n", 1)[0].strip()

    @property
    def url(self) -> str:
        return DOCS_URL.format(code=self.code)


def _info(code: str, name: str, category: str, severity: Severity, kind: str, doc: str) -> RuleInfo:
    return RuleInfo(
        code, name, category, severity, FixAvailability.NONE, True, inspect.cleandoc(doc), kind
    )


ENGINE_RULES: tuple[RuleInfo, ...] = (
    _info(
        "TD001",
        "unparsable-file",
        "engine",
        Severity.ERROR,
        "engine",
        """
        The file could not be read or parsed, so nothing in it was checked.

        ## What it does
        Reports a file that is not valid Python for the running interpreter, cannot be
        decoded with its declared encoding, or cannot be read at all. The rest of the
        run goes on.

        ## Use instead
        Fix the syntax error, or exclude the file (`--extend-exclude`).
        """,
    ),
    _info(
        "TD900",
        "internal-error",
        "engine",
        Severity.ERROR,
        "engine",
        """
        A torchdoctor rule crashed on this file; its other rules still ran.

        ## What it does
        Reports an unexpected exception inside one rule, naming the rule, instead of
        stopping the run with a traceback. Please report it with the file that caused it.
        """,
    ),
)

# Codes raised only at run time (guard, virtual accelerator, explain): no static rule.
RUNTIME_RULES: tuple[RuleInfo, ...] = ()


@functools.cache
def catalog() -> dict[str, RuleInfo]:
    """Every known code -> its metadata and docs, sorted by code."""
    entries: dict[str, RuleInfo] = {info.code: info for info in (*ENGINE_RULES, *RUNTIME_RULES)}
    for rule in rule_classes():
        entries[rule.code] = RuleInfo(
            code=rule.code,
            name=rule.name,
            category=rule.category,
            severity=rule.severity,
            fix=rule.fix_availability,
            default_enabled=rule.default_enabled,
            doc=rule.doc(),
            kind="static",
        )
    return dict(sorted(entries.items()))


def lookup(code_or_name: str) -> RuleInfo | None:
    """Find a rule by code (`td402` works) or by name (`load-without-map-location`)."""
    key = code_or_name.strip()
    entries = catalog()
    if key.upper() in entries:
        return entries[key.upper()]
    for info in entries.values():
        if info.name == key.lower():
            return info
    return None
