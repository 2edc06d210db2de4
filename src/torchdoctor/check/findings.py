"""What the checker reports: findings, their fixes and severities (plain data)."""

from __future__ import annotations

import enum
from dataclasses import dataclass, field


class Severity(str, enum.Enum):
    ERROR = "error"
    WARNING = "warning"
    INFO = "info"


class FixAvailability(str, enum.Enum):
    NONE = "none"
    SAFE = "safe"  # applied by --fix
    UNSAFE = "unsafe"  # applied by --fix --unsafe-fixes: may change behaviour


@dataclass(frozen=True)
class Edit:
    """Replace source[start:end] (character offsets into the checked text) with content."""

    start: int
    end: int
    content: str


@dataclass(frozen=True)
class Fix:
    edits: tuple[Edit, ...]
    applicability: FixAvailability
    message: str


@dataclass
class Finding:
    """One problem at one place. Lines are 1-based, columns 1-based (characters)."""

    code: str
    message: str
    line: int
    column: int
    end_line: int
    end_column: int
    fix: Fix | None = None
    hint: str | None = None
    # Lines on which a noqa comment also silences this finding (first/last line of the statement).
    noqa_lines: tuple[int, ...] = field(default=(), compare=False, repr=False)
