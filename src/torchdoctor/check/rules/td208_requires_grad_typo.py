from __future__ import annotations

import ast
from typing import TYPE_CHECKING, ClassVar

from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules._file_gate import skip_visits, words_starting_with
from torchdoctor.check.tree_walk import walk

if TYPE_CHECKING:
    from torchdoctor.check.context import FileContext

_CORRECT = "requiresgrad"
# Misspellings too far from "requires_grad" for the edit-distance test below.
_LONG_MISSPELLINGS = frozenset(
    {
        "requiregradient",
        "requiresgradient",
        "requiresgradients",
        "requiregradients",
        "requiredgradient",
        "requiregards",
    }
)


def misspelled(name: str) -> bool:
    """Whether `name` is a misspelling of `requires_grad` / `requires_grad_`.

    `require_grad`, `requires_grads`, `requires_gradient`, `requiresGrad`,
    `reqires_grad`, `requires_gard`, ... but not `requires_grad`, `requires_grad_`,
    private names (`_requires_grad`) or longer names that contain it
    (`inputs_require_grads`, `set_requires_grad`, `requires_gradient_sync`).
    """
    if name in ("requires_grad", "requires_grad_") or name.startswith("_") or name.isupper():
        return False  # the right name, a private one, or a constant (LintCode.REQUIRES_GRAD)
    key = name.lower().replace("_", "")
    if not key.startswith("req") or "g" not in key:
        return False
    return key in _LONG_MISSPELLINGS or _distance(key, _CORRECT) <= 2


def _distance(a: str, b: str) -> int:
    """Levenshtein distance with adjacent transpositions (optimal string alignment)."""
    if abs(len(a) - len(b)) > 2:
        return 3
    rows = [list(range(len(b) + 1))]
    for i in range(1, len(a) + 1):
        row = [i] + [0] * len(b)
        for j in range(1, len(b) + 1):
            cost = 0 if a[i - 1] == b[j - 1] else 1
            row[j] = min(rows[i - 1][j] + 1, row[j - 1] + 1, rows[i - 1][j - 1] + cost)
            if i > 1 and j > 1 and a[i - 1] == b[j - 2] and a[i - 2] == b[j - 1]:
                row[j] = min(row[j], rows[i - 2][j - 2] + 1)
        rows.append(row)
    return rows[-1][-1]


class RequiresGradTypo(Rule):
    """A misspelled `requires_grad` (`require_grad`, `requires_grads`, ...).

    ## What it does
    Finds attributes and keyword arguments named like `requires_grad` but spelled
    differently: `require_grad`, `requires_grads`, `require_grads`,
    `requires_gradient`, `requiresGrad`, `requieres_grad`, `requires_gard`, ...

    Names the file itself declares (a function parameter or a `self.` attribute of
    that name) are the author's own and are left alone, as is the
    `require_grad=` keyword of `torch.Tensor._make_subclass`, which really is
    spelled that way.

    ## Why is this bad?
    A tensor accepts any new Python attribute, so
    `param.require_grad = False` raises nothing: it adds an unused attribute and
    the parameter keeps training (the layer you meant to freeze keeps changing,
    and the optimizer still spends memory on it). `p.require_grad = True` on a
    new leaf silently leaves its `.grad` at `None`. Reading the misspelled name
    fails with `AttributeError: 'Tensor' object has no attribute 'require_grad'`,
    and the keyword form fails with `TypeError: zeros() got an unexpected keyword
    argument 'require_grad'`.

    ## Example
    ```python
    for param in model.backbone.parameters():
        param.require_grad = False  # the backbone still trains
    w = torch.zeros(3, requires_grads=True)  # TypeError
    ```

    ## Use instead
    ```python
    for param in model.backbone.parameters():
        param.requires_grad = False
    model.backbone.requires_grad_(False)  # or for the whole module at once
    w = torch.zeros(3, requires_grad=True)
    ```

    ## References
    - https://pytorch.org/docs/stable/notes/autograd.html#setting-requires-grad
    """

    code = "TD208"
    name = "requires-grad-typo"
    category = "training"
    severity = Severity.WARNING
    triggers: ClassVar[tuple[str, ...]] = ("grad", "Grad", "gard")
    node_types: ClassVar[tuple[type[ast.AST], ...]] = (ast.Attribute, ast.keyword)

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._declared: set[str] | None = None
        # (the words of the text hold every run of word characters: the same ones found)
        if not any(misspelled(word) for word in words_starting_with(ctx.word_text, "req")):
            skip_visits(self)  # no word of the file, let alone a name, is a misspelling

    def visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.Attribute):
            name = node.attr
        elif isinstance(node, ast.keyword) and node.arg is not None:
            name = node.arg
        else:
            return
        if name[:3].lower() != "req" or not misspelled(name) or name in self.declared():
            return
        if isinstance(node, ast.keyword):
            call = self.ctx.stack[-1] if self.ctx.stack else None
            callee = self.ctx.call_name(call) if call is not None else None
            if callee is not None and callee.endswith("_make_subclass"):
                return  # Tensor._make_subclass(cls, data, require_grad=...) is correct
            message = (
                f"`{name}=` is a misspelling of `requires_grad=`: the call fails with "
                "an unexpected-keyword TypeError (or the flag is silently ignored "
                "through **kwargs)"
            )
        elif isinstance(node.ctx, ast.Store):
            message = (
                f"`{self.ctx.segment(node)} = ...` is a misspelling of `requires_grad`: "
                "it only adds a new attribute, so gradients are not switched on or off"
            )
        else:
            message = (
                f"`{self.ctx.segment(node)}` is a misspelling of `requires_grad`: "
                "tensors and modules have no such attribute (AttributeError)"
            )
        self.report(node, message, hint="spell it `requires_grad`")

    def declared(self) -> set[str]:
        """Misspelled-looking names the file itself defines: parameters and `self.` fields."""
        if self._declared is None:
            names: set[str] = set()
            for sub in walk(self.ctx.tree):
                if isinstance(sub, ast.arg):
                    names.add(sub.arg)
                elif (
                    isinstance(sub, ast.Attribute)
                    and isinstance(sub.ctx, ast.Store)
                    and isinstance(sub.value, ast.Name)
                    and sub.value.id in ("self", "cls")
                ):
                    names.add(sub.attr)
            self._declared = {n for n in names if misspelled(n)}
        return self._declared
