"""`td.explain(exc_or_text)`: a PyTorch error → what it means, the likely causes, the fix.

Text is matched against the knowledge base (stdlib only, no torch needed). A
live exception is matched the same way, and its traceback is inspected too:
the user's own failing line, the innermost `nn.Module` whose forward failed,
the tensors involved with their devices/dtypes/shapes, and the culprit.
"""

from __future__ import annotations

import re
import textwrap
from dataclasses import dataclass, field
from typing import Any

from torchdoctor.errors import UsageError
from torchdoctor.explain import kb
from torchdoctor.explain.frames import (
    Culprit,
    FrameInfo,
    inspect_live,
    is_library_file,
    split_traceback,
    user_frame_from_text,
)
from torchdoctor.explain.kb import Cause, Fix

__all__ = ["CHECKLIST", "Cause", "Culprit", "Explanation", "Fix", "FrameInfo", "explain"]

# Said when no entry matches: where to look, rather than a guess.
CHECKLIST: tuple[str, ...] = (
    "Devices: are the model, every input and every tensor created in forward on one device? "
    "(td.device_of(model), td.device_of(batch))",
    "Dtypes: float32 model with float64 (NumPy) or float16 inputs? Class targets must be int64.",
    "Shapes: print the shapes going into the failing line; check batch vs feature dimensions.",
    "Mode: model.train() for training, model.eval() + torch.no_grad() for evaluation.",
    "Gradients: zero_grad() once per step; no in-place edits of tensors autograd still needs.",
    "Environment: `torchdoctor env` shows the torch build, CUDA and the visible devices.",
)


@dataclass
class Explanation:
    """What torchdoctor knows about one error. `str()` gives the readable report."""

    message: str
    known: bool
    id: str | None = None
    code: str | None = None
    topic: str | None = None
    title: str = ""
    summary: str = ""
    causes: tuple[Cause, ...] = ()
    fixes: tuple[Fix, ...] = ()
    facts: dict[str, Any] = field(default_factory=dict)
    culprits: tuple[Culprit, ...] = ()
    operands: tuple[Culprit, ...] = ()
    frame: FrameInfo | None = None
    module_path: str = ""
    module_class: str = ""

    @property
    def cause(self) -> str:
        """The most likely cause, in one sentence."""
        return self.causes[0].text if self.causes else ""

    @property
    def fix(self) -> str:
        """The first fix, with its snippet."""
        if not self.fixes:
            return ""
        first = self.fixes[0]
        return f"{first.text}\n{first.code}" if first.code else first.text

    def as_dict(self) -> dict[str, Any]:
        return {
            "known": self.known,
            "id": self.id,
            "code": self.code,
            "topic": self.topic,
            "title": self.title,
            "summary": self.summary,
            "message": self.message,
            "facts": self.facts,
            "causes": [c.as_dict() for c in self.causes],
            "fixes": [f.as_dict() for f in self.fixes],
            "culprits": [c.as_dict() for c in self.culprits],
            "frame": self.frame.as_dict() if self.frame else None,
            "module": {"path": self.module_path, "class": self.module_class}
            if self.module_path
            else None,
            "checklist": [] if self.known else list(CHECKLIST),
        }

    def __str__(self) -> str:
        lines: list[str] = []
        first_line = self.message.strip().splitlines()[0] if self.message.strip() else ""
        if len(first_line) > 300:
            first_line = first_line[:297] + "..."
        if self.known:
            head = " · ".join(part for part in (self.code, self.topic, self.title) if part)
            lines.append(f"torchdoctor: {head}")
        else:
            lines.append("torchdoctor: this error is not in the knowledge base")
        if first_line:
            lines.append(f"  {first_line}")
        if self.facts:
            shown = [
                f"{key}: {', '.join(value) if isinstance(value, list) else value}"
                for key, value in self.facts.items()
            ]
            lines.append("  " + " · ".join(shown))
        if self.summary:
            lines += ["", *textwrap.wrap(self.summary, 88)]
        if self.frame:
            lines += ["", f"Where: {self.frame}"]
        if self.module_path:
            lines.append(f"Failing module: {self.module_path} ({self.module_class})")
        if self.culprits:
            lines += ["", "Culprit:" if len(self.culprits) == 1 else "Culprits:"]
            lines += [f"  - {c}" for c in self.culprits]
        elif self.operands:
            lines += ["", "Tensors involved:"]
            lines += [f"  - {c}" for c in self.operands[:12]]
        if self.causes:
            lines += ["", "Likely causes, most likely first:"]
            for number, cause in enumerate(self.causes, 1):
                codes = f" [{', '.join(cause.codes)}]" if cause.codes else ""
                lines.append(f"  {number}. {cause.text}{codes}")
                if cause.tell:
                    lines += textwrap.wrap(
                        f"How to tell: {cause.tell}",
                        84,
                        initial_indent="     ",
                        subsequent_indent="     ",
                    )
        if self.fixes:
            lines += ["", "Fix:"]
            for fix in self.fixes:
                lines.append(f"  - {fix.text}")
                lines += [f"        {code_line}" for code_line in fix.code.splitlines()]
        if not self.known:
            lines += ["", "I do not know this message, so rather than guess, check in turn:"]
            lines += [f"  - {item}" for item in CHECKLIST]
            lines.append("  Then run `torchdoctor check` on your code to find known mistakes.")
        elif self.code:
            lines += ["", f"Docs: torchdoctor rule {self.code}"]
        return "\n".join(lines)


def _from_entry(
    message: str, entry: kb.Entry, facts: dict[str, Any], frame: FrameInfo | None
) -> Explanation:
    causes = entry.causes_for(message) or entry.causes
    return Explanation(
        message=message,
        known=True,
        id=entry.id,
        code=causes[0].codes[0] if causes[0].codes else None,
        topic=entry.topic,
        title=entry.title,
        summary=entry.summary,
        causes=causes,
        fixes=entry.fixes,
        facts=facts,
        frame=frame,
    )


# Terminal colour and cursor codes (CSI sequences) that torch and rich tracebacks emit.
_ANSI_ESCAPE = re.compile(r"\x1b\[[0-?]*[ -/]*[@-~]|\x1b[@-Z\\-_]")


def strip_ansi(text: str) -> str:
    """The text without terminal escape sequences (linear time: no nested repeats)."""
    return _ANSI_ESCAPE.sub("", text) if "\x1b" in text else text


def _in_torch(filename: str) -> bool:
    """A file of the torch package wherever it is installed (a source checkout too)."""
    return "/torch/" in filename.replace("\\", "/")


def _user_frame(frames: list[FrameInfo]) -> FrameInfo | None:
    """The innermost frame of the user's own code; None when the text shows only library frames."""
    frame = user_frame_from_text([f for f in frames if not _in_torch(f.filename)])
    if frame is None or is_library_file(frame.filename):
        return None
    return frame


def _explain_text(text: str) -> Explanation:
    messages, frames = split_traceback(strip_ansi(text))
    frame = _user_frame(frames)
    # The last exception of a chain is what the user saw; earlier ones may hold the cause.
    for message in reversed(messages):
        found = kb.best_match(message)
        if found:
            entry, match = found
            return _from_entry(message, entry, kb.message_facts(message, match), frame)
    message = messages[-1]
    return Explanation(message=message, known=False, facts=kb.message_facts(message), frame=frame)


def _chain(exc: BaseException) -> list[BaseException]:
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and current not in chain and len(chain) < 10:
        chain.append(current)
        current = current.__cause__ or current.__context__
    return chain


def _exception_text(exc: BaseException) -> str:
    try:
        message = str(exc)
    except Exception:  # a broken __str__ must not hide the user's own error
        message = "<exception str() failed>"
    return f"{type(exc).__name__}: {strip_ansi(message)}"


def _explain_exception(exc: BaseException, model: Any) -> Explanation:
    attached = getattr(exc, "explanation", None)
    if isinstance(attached, Explanation):
        return attached
    for candidate in _chain(exc):
        text = _exception_text(candidate)
        found = kb.best_match(text)
        if found:
            entry, match = found
            explanation = _from_entry(text, entry, kb.message_facts(text, match), None)
            _add_live_findings(explanation, candidate, model)
            return explanation
    explanation = Explanation(message=_exception_text(exc), known=False)
    _add_live_findings(explanation, exc, model)
    if explanation.culprits and explanation.code:
        # a device error the knowledge base does not word this way, diagnosed from the frames
        explanation.known = True
        explanation.topic = "device"
        explanation.title = "Tensors on different devices in one operation"
    return explanation


def _add_live_findings(explanation: Explanation, exc: BaseException, model: Any) -> None:
    findings = inspect_live(exc, model, explanation.topic or "")
    explanation.frame = findings.frame
    explanation.module_path = findings.module_path
    explanation.module_class = findings.module_class
    explanation.culprits = findings.culprits
    explanation.operands = findings.operands
    if findings.codes:
        # What the frames show outranks what the message alone suggests.
        order = {code: rank for rank, code in enumerate(findings.codes)}

        def rank(cause: Cause) -> int:
            return min((order[c] for c in cause.codes if c in order), default=len(order))

        covered = {code for cause in explanation.causes for code in cause.codes}
        found = tuple(
            Cause(f"{c.role} `{c.name}` is on {c.device}: {c.note}.", (c.code,))
            for c in findings.culprits
            if c.code and c.code not in covered
        )
        causes = tuple(sorted((*found, *explanation.causes), key=rank))
        diagnosis = findings.diagnosis
        if diagnosis is not None and diagnosis.culprits:
            # the frames named the culprit: the causes pointing elsewhere are ruled out
            causes = tuple(c for c in causes if diagnosis.code in c.codes) or causes
        explanation.causes = causes
        explanation.code = findings.codes[0]


def explain(exc_or_text: BaseException | str, *, model: Any = None) -> Explanation:
    """Explain a PyTorch error: pass the exception itself (best) or its message/traceback text.

    `model` (optional) is the top-level module, used to name the failing submodule
    by its path; without it the outermost module in the traceback is used.
    """
    if isinstance(exc_or_text, BaseException):
        return _explain_exception(exc_or_text, model)
    if isinstance(exc_or_text, str):
        return _explain_text(exc_or_text)
    raise UsageError(
        f"explain() takes an exception or the text of an error, not {type(exc_or_text).__name__}"
    )
