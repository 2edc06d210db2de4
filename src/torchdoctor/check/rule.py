"""What a rule is and what it reports.

A rule is one module in `check/rules/` defining one `Rule` subclass. Its
docstring is the user's documentation, in ruff's shape: What it does / Why is
this bad? / Example / Use instead / Fix safety / References.
"""

from __future__ import annotations

import ast
import inspect
from typing import TYPE_CHECKING, ClassVar

from torchdoctor.check.findings import Edit, Finding, Fix, FixAvailability, Severity

if TYPE_CHECKING:
    from torchdoctor.check.context import FileContext

__all__ = ["Edit", "Finding", "Fix", "FixAvailability", "Rule", "Severity"]


class Rule:
    """Base class of every static rule.

    The engine walks each file's tree once and calls `visit(node)` for nodes
    whose type is in `node_types`, with `ctx.stack` holding the ancestors;
    then calls `finish()` for whole-file analysis. A rule whose `triggers`
    (substrings) all miss the file's text is skipped for that file.
    """

    code: ClassVar[str]
    name: ClassVar[str]
    category: ClassVar[str]  # device, training, loss, checkpoint, data, deprecation
    severity: ClassVar[Severity] = Severity.WARNING
    fix_availability: ClassVar[FixAvailability] = FixAvailability.NONE
    default_enabled: ClassVar[bool] = True
    # "bugs": the finding says the code is wrong (on by default); "advice": portability,
    # performance or style notes, off by default, switched on with `--extend-select advice`.
    group: ClassVar[str] = "bugs"
    triggers: ClassVar[tuple[str, ...]] = ()
    node_types: ClassVar[tuple[type[ast.AST], ...]] = ()

    def __init__(self, ctx: FileContext) -> None:
        self.ctx = ctx

    def visit(self, node: ast.AST) -> None:
        """Called for each node of a type in `node_types`."""

    def visit_needles(self) -> tuple[str, ...] | None:
        """Substrings every node this rule's `visit` reports on holds in its own source
        text (a `.cuda()` call holds "cuda"); None (the default): no such promise.

        When every rule visiting a file makes this promise, the engine walks only the
        statements whose lines hold a needle, not the whole tree. So `visit` must
        report only on such nodes, and keep no state from the nodes it is shown.
        """
        return None

    def visit_words(self) -> tuple[str, ...] | None:
        """Identifiers every node this rule's `visit` reports on holds, each standing as a
        whole word in its own source text (`torch.load(...)` holds `load`, and so does
        `x.load(...)`, but `overload` does not): the same promise as `visit_needles`,
        narrower, since a line holding the word inside a longer one (`VariableTracker`)
        is not walked for it. None (the default): no such promise."""
        return None

    def finish(self) -> None:
        """Called once after the walk."""

    def report(
        self,
        node: ast.AST,
        message: str,
        *,
        fix: Fix | None = None,
        hint: str | None = None,
    ) -> None:
        self.ctx.add_finding(self.code, node, message, fix=fix, hint=hint)

    # -- documentation --------------------------------------------------
    @classmethod
    def doc(cls) -> str:
        return inspect.cleandoc(cls.__doc__ or "")

    @classmethod
    def summary(cls) -> str:
        return cls.doc().split("\n", 1)[0].strip()
