"""Every rule documents itself in ruff's shape; `torchdoctor rule CODE` prints it."""

from __future__ import annotations

import re

import pytest

from torchdoctor.check.registry import rule_classes
from torchdoctor.check.rule import FixAvailability, Rule

REQUIRED = ("## What it does", "## Why is this bad?", "## Example", "## Use instead")
KEBAB = re.compile(r"^[a-z0-9]+(?:-[a-z0-9]+)*$")
CATEGORIES = {"device", "training", "loss", "checkpoint", "data", "deprecation"}


@pytest.mark.parametrize("rule", rule_classes(), ids=[r.code for r in rule_classes()])
def test_rule_docstring_has_the_required_sections(rule: type[Rule]) -> None:
    doc = rule.doc()
    summary = rule.summary()
    assert summary and not summary.startswith("#"), f"{rule.code}: first line must be a summary"
    headings = [line.strip() for line in doc.splitlines() if line.startswith("## ")]
    wanted = list(REQUIRED)
    if rule.fix_availability is not FixAvailability.NONE:
        wanted.append("## Fix safety")
    missing = [h for h in wanted if h not in headings]
    assert not missing, f"{rule.code} docstring lacks {missing}"
    order = [headings.index(h) for h in wanted]
    assert order == sorted(order), f"{rule.code}: sections out of order {headings}"
    for heading in wanted:
        body = doc.split(heading, 1)[1].split("\n## ", 1)[0].strip()
        assert body, f"{rule.code}: '{heading}' is empty"
    for heading in ("## Example", "## Use instead"):
        body = doc.split(heading, 1)[1].split("\n## ", 1)[0]
        assert "```python" in body, f"{rule.code}: '{heading}' needs a python code block"


@pytest.mark.parametrize("rule", rule_classes(), ids=[r.code for r in rule_classes()])
def test_rule_metadata(rule: type[Rule]) -> None:
    assert re.fullmatch(r"TD[1-8]\d\d", rule.code)
    assert KEBAB.match(rule.name), rule.name
    assert rule.category in CATEGORIES
    # a rule does its work in visit() (for node_types) or in finish()
    assert rule.node_types or rule.finish is not Rule.finish, f"{rule.code} never runs"
