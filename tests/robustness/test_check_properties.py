"""Property tests of the checker on generated Python (hypothesis + hypothesmith).

- The checker never raises, and no rule crashes (TD900), on any module Python parses:
  hypothesmith's grammar-generated modules, alone and with torch code from the rules'
  own documentation spliced in between their statements (so the rules really run).
- `--fix` (the engine's fix loop, `check_text`) on generated modules with known-bad,
  fixable snippets spliced in: the output parses, fixing again changes nothing, and
  every pass only changes the lines of the statements its findings flagged.

The test-suite run is short; `TORCHDOCTOR_FUZZ_EXAMPLES=500` runs a real campaign.
"""

from __future__ import annotations

import ast
import difflib
import os
import re
import textwrap
import warnings

import hypothesmith
import pytest
from hypothesis import HealthCheck, event, given, note, settings
from hypothesis import strategies as st

from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.engine import RunOptions, apply_noqa, check_source, check_text
from torchdoctor.check.fix import apply_edits, fixable
from torchdoctor.check.registry import rule_classes
from torchdoctor.check.rule import Finding

RULES = rule_classes()
ENABLED = frozenset(rule.code for rule in RULES)
FIX_ALL = RunOptions(enabled=ENABLED, fix=True, unsafe_fixes=True)
EXAMPLES = int(os.environ.get("TORCHDOCTOR_FUZZ_EXAMPLES", "25"))

pytestmark = [
    pytest.mark.filterwarnings("ignore::SyntaxWarning"),  # generated code is odd on purpose
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
]
fuzz = settings(
    max_examples=EXAMPLES,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    database=None,  # no .hypothesis/ writes from the shared test run
)

# Known-bad code with a fix, one per fixable rule; each is checked alone below.
FIXABLE: dict[str, str] = {
    "TD402": "import torch\nstate = torch.load(path)\n",
    "TD102": (
        "import torch\n\n\ndef train_step(model, loader, device):\n"
        "    for images, labels in loader:\n        images.to(device)\n"
        "        loss = model(images)\n"
    ),
    "TD106": (
        "import torch\n\n\ndef weights(n):\n    w = torch.ones(n, requires_grad=True)\n"
        "    return w.numpy()\n"
    ),
    "TD104": (
        "import torch\nfrom torch import nn\n\n\nclass PositionalEncoding(nn.Module):\n"
        "    def __init__(self, dim):\n        super().__init__()\n"
        "        self.pe = torch.zeros(16, dim)\n\n"
        "    def forward(self, x):\n        return x + self.pe\n"
    ),
    "TD105": (
        "import torch\nfrom torch import nn\n\n\nclass Blocks(nn.Module):\n"
        "    def __init__(self, dim):\n        super().__init__()\n"
        "        self.blocks = [nn.Linear(dim, dim) for _ in range(3)]\n\n"
        "    def forward(self, x):\n        for block in self.blocks:\n"
        "            x = block(x)\n        return x\n"
    ),
}


def _doc_examples() -> list[str]:
    """Every ```python block of every rule's docs that parses on its own."""
    blocks = []
    for rule in RULES:
        for block in re.findall(r"```python\n(.*?)```", rule.doc(), re.S):
            code = textwrap.dedent(block)
            try:
                ast.parse(code)
            except SyntaxError:
                continue
            blocks.append("import torch\nfrom torch import nn\n" + code)
    return blocks


DOC_EXAMPLES = _doc_examples()


def _statement_starts(source: str) -> list[int]:
    """Offsets where a top-level statement starts a line (and the end): safe splice points."""
    tree = ast.parse(source)
    line_starts = [0] + [m.end() for m in re.finditer(r"\r\n|\r|\n", source)]
    points = {len(source)}
    for stmt in tree.body:
        first = min([stmt.lineno, *(d.lineno - 1 for d in getattr(stmt, "decorator_list", []))])
        if stmt.col_offset == 0 and first - 1 < len(line_starts):
            points.add(line_starts[first - 1])
    return sorted(points)


@st.composite
def spliced(draw: st.DrawFn, snippets: list[str], hosts: st.SearchStrategy[str]) -> str:
    """A generated module with 1-3 snippets inserted between its top-level statements."""
    host = draw(hosts)
    if host and not host.endswith(("\n", "\r")):
        host += "\n"
    points = _statement_starts(host)
    chosen = draw(st.lists(st.sampled_from(snippets), min_size=1, max_size=3))
    inserts = sorted(
        ((draw(st.sampled_from(points)), i, s) for i, s in enumerate(chosen)), reverse=True
    )
    text = host
    for point, _, snippet in inserts:
        text = text[:point] + "\n" + snippet + "\n" + text[point:]
    try:
        ast.parse(text)
    except (SyntaxError, ValueError):  # e.g. a `from __future__` import no longer first
        st.assume(False)
    note(text)
    return text


def _check(source: str) -> list[Finding]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return check_source(source, "generated.py", RULES)


def _assert_sane(source: str, findings: list[Finding]) -> None:
    crashed = [f.message for f in findings if f.code == "TD900"]
    assert not crashed, crashed
    last_line = len(_lines(source)) + 1
    for finding in findings:
        assert finding.code in ENABLED or finding.code == "TD001"
        assert 1 <= finding.line <= finding.end_line <= last_line
        assert finding.message.strip()


# ------------------------------------------------------------------ never raises


@fuzz
@given(hypothesmith.from_grammar())
def test_never_raises_on_generated_modules(source: str) -> None:
    _assert_sane(source, _check(source))


@fuzz
@given(spliced(DOC_EXAMPLES, hypothesmith.from_grammar()))
def test_never_raises_with_torch_code_spliced_in(source: str) -> None:
    _assert_sane(source, _check(source))


@settings(fuzz, max_examples=max(5, EXAMPLES // 3))
@given(hypothesmith.from_node())
def test_never_raises_on_libcst_generated_modules(source: str) -> None:
    _assert_sane(source, _check(source))


def test_doc_examples_were_found() -> None:
    # one ```python block or more per rule: the splice corpus grows with the rules
    assert len(DOC_EXAMPLES) >= len(RULES)


# ------------------------------------------------------------------ --fix


def _flagged_lines(finding: Finding) -> range:
    lines = (finding.line, finding.end_line, *finding.noqa_lines)
    return range(min(lines), max(lines) + 1)


def _lines(text: str) -> list[str]:
    # Python's own line breaks only: str.splitlines also splits at \x0c, \x1e, \u2028, ...
    return re.findall(r"[^\r\n]*(?:\r\n|\r|\n)|[^\r\n]+$", text)


def _changed_lines(before: str, after: str) -> set[int]:
    """1-based lines of `before` that differ in `after` (an insertion marks its neighbour)."""
    old, new = _lines(before), _lines(after)
    changed: set[int] = set()
    matcher = difflib.SequenceMatcher(None, old, new, autojunk=False)
    for tag, i1, i2, _, _ in matcher.get_opcodes():
        if tag != "equal":
            changed.update(range(i1 + 1, i2 + 1) if i2 > i1 else (i1, i1 + 1))
    return changed


def _fix_pass(text: str) -> tuple[str, list[Finding]]:
    """One pass of the engine's fix loop; checks that it only touches flagged lines."""
    findings = [f for f in _check(text) if fixable(f, unsafe=True)]
    new_text, applied = apply_edits(text, findings, unsafe=True)
    if applied:
        allowed = set().union(*(_flagged_lines(f) for f in findings))
        allowed |= {line + 1 for line in allowed}  # an insertion at a line's very end
        stray = _changed_lines(text, new_text) - allowed
        assert not stray, f"lines {sorted(stray)} changed but were not flagged"
    return new_text, findings


def _fix(source: str) -> tuple[str, int]:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _, text, fixed = check_text(source, "generated.py", RULES, build_project([source]), FIX_ALL)
    return text, fixed


@pytest.mark.parametrize("code", sorted(FIXABLE))
def test_each_fixable_snippet_is_fixed_alone(code: str) -> None:
    findings = _check(FIXABLE[code])
    assert [f.code for f in findings if fixable(f, unsafe=True)] == [code]
    fixed, count = _fix(FIXABLE[code])
    assert count == 1
    assert not [f for f in _check(fixed) if f.code == code]


@fuzz
@given(spliced(list(FIXABLE.values()), hypothesmith.from_grammar()))
def test_fix_parses_is_idempotent_and_only_touches_flagged_lines(source: str) -> None:
    fixed, count = _fix(source)
    event(f"fixes applied: {min(count, 3)}{'+' if count > 3 else ''}")
    ast.parse(fixed)  # the output is still Python
    assert count >= 1 or fixed == source
    # the same result, pass by pass, with each pass confined to its findings' lines
    text = source
    for _ in range(10):
        new_text, _ = _fix_pass(text)
        if new_text == text:
            break
        text = new_text
    assert text == fixed
    again, count_again = _fix(fixed)
    assert (again, count_again) == (fixed, 0)
    _assert_sane(fixed, apply_noqa(_check(fixed), fixed))
