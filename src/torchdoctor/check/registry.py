"""Finds the rules: every module in `check/rules/` defines exactly one Rule subclass."""

from __future__ import annotations

import functools
import importlib
import inspect
import pkgutil

from torchdoctor.check.rule import Rule


@functools.cache
def rule_classes() -> tuple[type[Rule], ...]:
    """All static rules, sorted by code. Adding a rule = adding one file."""
    from torchdoctor.check import rules as package

    found: dict[str, type[Rule]] = {}
    for info in pkgutil.iter_modules(package.__path__):
        if info.name.startswith("_"):
            continue
        module = importlib.import_module(f"{package.__name__}.{info.name}")
        defined = [
            obj
            for obj in vars(module).values()
            if inspect.isclass(obj)
            and issubclass(obj, Rule)
            and obj is not Rule
            and obj.__module__ == module.__name__
        ]
        if len(defined) != 1:
            raise RuntimeError(f"{module.__name__} must define exactly one Rule subclass")
        rule = defined[0]
        if rule.code in found:
            raise RuntimeError(f"rule code {rule.code} is defined twice")
        found[rule.code] = rule
    return tuple(found[code] for code in sorted(found))


def rules_by_code() -> dict[str, type[Rule]]:
    return {rule.code: rule for rule in rule_classes()}
