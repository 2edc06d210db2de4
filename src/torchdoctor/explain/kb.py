"""The error knowledge base: one TOML file per entry in `kb/`, loaded once.

No torch needed: `torchdoctor explain "message"` works on any machine.
Each entry names the messages it matches (regular expressions covering old
and new PyTorch wordings), what they mean, the ranked causes with their rule
codes and how to tell them apart, and the fixes.

Patterns are compiled with RE2 (google-re2), whose matching time is linear in the
input: people pipe multi-megabyte logs into `explain`, and one backtracking
pattern made that take minutes. RE2 has no lookarounds or backreferences, so a
pattern that needs them is a knowledge-base error caught when it is loaded.
"""

from __future__ import annotations

import functools
import re
import sys
from dataclasses import dataclass, field
from importlib import resources
from typing import Any

import re2

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

TOPICS = (
    "device",
    "dtype",
    "autograd",
    "checkpoint",
    "environment",
    "mode",
    "numpy",
    "distributed",
    "memory",
    "shape",
)

_RULE_CODE = re.compile(r"^TD\d{3}$")

# An RE2 pattern (re2.compile): search(), finditer(), and matches with start()/groupdict().
Pattern = Any
Match = Any


def compile_pattern(pattern: str) -> Pattern:
    """Compile a knowledge-base pattern with RE2, case-insensitively (linear-time matching)."""
    return re2.compile("(?i)" + pattern)


class KnowledgeBaseError(ValueError):
    """A knowledge-base file is malformed (a bug in torchdoctor, caught by its tests)."""


@dataclass(frozen=True)
class Cause:
    """One possible reason for an error, with the rule codes that catch it."""

    text: str
    codes: tuple[str, ...] = ()
    tell: str = ""  # how to tell this cause apart from the others
    when: Pattern | None = None  # only a cause when the message matches this

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "codes": list(self.codes), "tell": self.tell}


@dataclass(frozen=True)
class Fix:
    text: str
    code: str = ""  # a short snippet

    def as_dict(self) -> dict[str, Any]:
        return {"text": self.text, "code": self.code}


@dataclass(frozen=True)
class Entry:
    id: str
    topic: str
    title: str
    summary: str
    patterns: tuple[Pattern, ...]
    causes: tuple[Cause, ...]
    fixes: tuple[Fix, ...]
    examples: tuple[str, ...] = ()
    priority: int = 0  # higher wins when several entries match one message
    codes: tuple[str, ...] = field(default=())  # every code of every cause, in rank order

    def causes_for(self, text: str) -> tuple[Cause, ...]:
        """The causes that fit this message (a cause with `when` must match it)."""
        return tuple(c for c in self.causes if c.when is None or c.when.search(text))

    def search(self, text: str) -> Match | None:
        for pattern in self.patterns:
            match = pattern.search(text)
            if match:
                return match
        return None


def _require(data: dict[str, Any], key: str, kind: type, where: str) -> Any:
    value = data.get(key)
    if not isinstance(value, kind) or (isinstance(value, (str, list)) and not value):
        raise KnowledgeBaseError(f"{where}: `{key}` must be a non-empty {kind.__name__}")
    return value


def parse_entry(name: str, data: dict[str, Any]) -> Entry:
    """Validate one parsed TOML file and build its Entry."""
    where = f"kb/{name}.toml"
    entry_id = _require(data, "id", str, where)
    if entry_id != name:
        raise KnowledgeBaseError(f"{where}: id {entry_id!r} must equal the file name")
    topic = _require(data, "topic", str, where)
    if topic not in TOPICS:
        raise KnowledgeBaseError(f"{where}: topic {topic!r} is not one of {', '.join(TOPICS)}")
    try:
        patterns = tuple(compile_pattern(p) for p in _require(data, "patterns", list, where))
    except re2.error as exc:
        raise KnowledgeBaseError(f"{where}: bad pattern: {exc}") from exc
    causes = []
    for raw in _require(data, "causes", list, where):
        codes = tuple(raw.get("codes", ()))
        bad = [c for c in codes if not _RULE_CODE.match(c)]
        if bad:
            raise KnowledgeBaseError(f"{where}: bad rule code(s) {bad}")
        try:
            when = compile_pattern(raw["when"]) if "when" in raw else None
        except re2.error as exc:
            raise KnowledgeBaseError(f"{where}: bad `when` pattern: {exc}") from exc
        causes.append(Cause(_require(raw, "text", str, where), codes, raw.get("tell", ""), when))
    fixes = [
        Fix(_require(raw, "text", str, where), raw.get("code", "").strip("\n"))
        for raw in _require(data, "fixes", list, where)
    ]
    all_codes = tuple(dict.fromkeys(code for cause in causes for code in cause.codes))
    return Entry(
        id=entry_id,
        topic=topic,
        title=_require(data, "title", str, where),
        summary=" ".join(_require(data, "summary", str, where).split()),
        patterns=patterns,
        causes=tuple(causes),
        fixes=tuple(fixes),
        examples=tuple(data.get("examples", ())),
        priority=int(data.get("priority", 0)),
        codes=all_codes,
    )


@functools.cache
def entries() -> tuple[Entry, ...]:
    """Every entry, sorted by id."""
    folder = resources.files("torchdoctor.explain") / "kb"
    loaded = []
    for item in sorted(folder.iterdir(), key=lambda p: p.name):
        if not item.name.endswith(".toml"):
            continue
        name = item.name[: -len(".toml")]
        try:
            data = tomllib.loads(item.read_text(encoding="utf-8"))
        except tomllib.TOMLDecodeError as exc:
            raise KnowledgeBaseError(f"kb/{item.name}: {exc}") from exc
        loaded.append(parse_entry(name, data))
    return tuple(loaded)


@functools.cache
def _pattern_set() -> tuple[Any, tuple[Entry, ...]] | None:
    """Every entry's patterns in one RE2 set: one pass over the text says which entries match.

    None when RE2 cannot build the set (it then falls back to one search per pattern).
    """
    try:
        combined = re2.Set.SearchSet(re2.Options())
        owners = []
        for entry in entries():
            for pattern in entry.patterns:
                combined.Add(pattern.pattern)
                owners.append(entry)
        combined.Compile()
    except (re2.error, ValueError, TypeError):  # pragma: no cover - a pattern RE2 sets refuse
        return None
    return combined, tuple(owners)


def _candidates(text: str) -> tuple[Entry, ...]:
    """The entries with at least one matching pattern (all entries if the set cannot tell)."""
    compiled = _pattern_set()
    if compiled is not None:
        combined, owners = compiled
        try:
            hits = combined.Match(text)
        except (re2.error, ValueError, TypeError):  # pragma: no cover - RE2 out of memory
            return entries()
        return tuple(dict.fromkeys(owners[i] for i in sorted(hits or ())))  # None: no match
    return entries()  # pragma: no cover


def best_match(text: str) -> tuple[Entry, Match] | None:
    """The entry that explains `text`: highest priority, then earliest match in the text."""
    found: list[tuple[int, int, Entry, Match]] = []
    for entry in _candidates(text):
        match = entry.search(text)
        if match:
            found.append((-entry.priority, match.start(), entry, match))
    if not found:
        return None
    found.sort(key=lambda item: (item[0], item[1]))
    return found[0][2], found[0][3]


# --- facts read from the message itself -------------------------------------------------

_DEVICE = re.compile(
    r"(?<![\w.])(cuda:\d+|cuda|cpu|mps(?::\d+)?|meta|xpu(?::\d+)?|hpu(?::\d+)?)(?![\w])",
    re.IGNORECASE,
)
_LEGACY_TYPE = re.compile(r"torch\.(cuda\.)?(\w+?)Tensor\b")
_OPS = (
    re.compile(r"in method wrapper_(?:CUDA_|CPU_|MPS_|XPU_)?_*(\w+?)\)"),
    re.compile(r"in call to _(?:th|thnn)_(\w+)"),
    re.compile(r"while checking arguments for (\w+)"),
    re.compile(r"Could not run '(aten::[\w.]+)'"),
)
_ARGUMENTS = (
    re.compile(r"argument #\d+ '(\w+)'"),
    re.compile(r"for argument (?:argument )?(\w+) in method"),
    re.compile(r"but got (\w+) is on \w+"),
)


_FACTS_WINDOW = 8_000  # characters either side of the match that facts are read from


def message_facts(text: str, match: Match | None = None) -> dict[str, Any]:
    """Devices, argument names, op and other details named in an error message."""
    facts: dict[str, Any] = {}
    if match is not None:
        facts.update({k: v for k, v in match.groupdict().items() if v})
    if len(text) > 2 * _FACTS_WINDOW:  # a whole log: the facts are in the matched error
        start = match.start() if match is not None else len(text) - _FACTS_WINDOW
        text = text[max(0, start - _FACTS_WINDOW) : start + _FACTS_WINDOW]
    devices: list[str] = []
    for legacy in _LEGACY_TYPE.finditer(text):
        devices.append("cuda" if legacy.group(1) else "cpu")
    for found in _DEVICE.finditer(text):
        devices.append(found.group(1).lower())
    # "cuda" alone adds nothing when "cuda:0" is named too
    indexed = {d.split(":")[0] for d in devices if ":" in d}
    unique = [d for d in dict.fromkeys(devices) if d not in indexed]
    if len(unique) >= 1 and ("device" in text.lower() or "Tensor" in text):
        facts.setdefault("devices", unique)
    for pattern in _OPS:
        op = pattern.search(text)
        if op:
            facts.setdefault("op", op.group(1))
            break
    for pattern in _ARGUMENTS:
        argument = pattern.search(text)
        if argument:
            facts.setdefault("argument", argument.group(1))
            break
    return facts
