"""Cross-file facts: which classes in the checked tree are nn.Module subclasses.

Built before any rule runs from a fast text scan of every file (no parse), so
that `class Net(BaseModel)` in one file and `class BaseModel(nn.Module)` in
another are both known to be modules, through any chain of inheritance.
"""

from __future__ import annotations

import ast
import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from torchdoctor.check.context import FileContext
    from torchdoctor.check.project_facts import CallFact

# `class Name(bases...)`: bases may span lines; nested brackets are rare in bases.
CLASS_HEADER = re.compile(r"^[ \t]*class[ \t]+(\w+)[ \t]*\(([^()]*)\)", re.MULTILINE)

# Base classes from torch and its ecosystem that make a class a module.
KNOWN_MODULE_BASES = frozenset(
    {
        "Module",
        "Sequential",
        "ModuleList",
        "ModuleDict",
        "LightningModule",
        "PreTrainedModel",
        "ScriptModule",
    }
)
_TORCH_NN_PREFIXES = ("nn.", "torch.nn.")


def _base_is_torch_module(base: str) -> bool:
    """`nn.Linear`, `torch.nn.Module`, `Module`: a torch.nn layer (capitalised name)."""
    last = base.rsplit(".", 1)[-1]
    if last in KNOWN_MODULE_BASES:
        return True
    return base.startswith(_TORCH_NN_PREFIXES) and last[:1].isupper()


def scan_classes(source: str) -> dict[str, list[str]]:
    """Class name -> base expressions (as text) for every class header in `source`."""
    found: dict[str, list[str]] = {}
    if "class" not in source:
        return found
    for match in CLASS_HEADER.finditer(source):
        bases = []
        for part in match.group(2).split(","):
            part = part.strip()
            if part and "=" not in part:  # skip metaclass=..., other keywords
                bases.append(part.split("[", 1)[0].strip())
        found.setdefault(match.group(1), []).extend(bases)
    return found


@dataclass
class ProjectIndex:
    """Class facts for the whole checked tree."""

    bases: dict[str, set[str]] = field(default_factory=dict)
    module_classes: frozenset[str] = frozenset()
    # Callee name -> calls of it in other files that pass a moved model or a loader
    # (project_facts.py; used by the device rules' dataflow).
    call_facts: dict[str, tuple[CallFact, ...]] = field(default_factory=dict)
    # Classes that move data to the device themselves (project_facts.moving_classes).
    moving_classes: frozenset[str] = frozenset()

    @classmethod
    def build(cls, sources: Iterable[str | tuple[str, str]]) -> ProjectIndex:
        """Index `sources`: texts, or (path, text) pairs (paths name files in messages)."""
        from torchdoctor.check import project_facts

        index = cls()
        candidates: list[tuple[str, str]] = []
        moving: set[str] = set()
        count = 0
        for item in sources:
            path, source = item if isinstance(item, tuple) else ("", item)
            index.add(scan_classes(source))
            moving |= project_facts.moving_classes(source)
            count += 1
            if project_facts.is_candidate(source):
                candidates.append((path, source))
        index.moving_classes = frozenset(moving)
        index.resolve()
        if candidates and count > 1:  # a lone file sees its own calls directly
            index.call_facts = project_facts.collect(index, candidates)
        return index

    def call_facts_for(self, callee: str, path: str) -> list[CallFact]:
        """Calls of `callee` seen in files other than `path`."""
        return [f for f in self.call_facts.get(callee, ()) if not path or f.path != path]

    def add(self, classes: dict[str, list[str]]) -> None:
        for name, bases in classes.items():
            self.bases.setdefault(name, set()).update(bases)

    def resolve(self) -> None:
        """Close over inheritance: a class is a module if any base is one."""
        modules: set[str] = set()
        changed = True
        while changed:
            changed = False
            for name, bases in self.bases.items():
                if name in modules:
                    continue
                for base in bases:
                    if _base_is_torch_module(base) or base.rsplit(".", 1)[-1] in modules:
                        modules.add(name)
                        changed = True
                        break
        self.module_classes = frozenset(modules)

    def fingerprint(self) -> str:
        """Changes whenever the set of module classes changes (part of the cache key)."""
        text = "\n".join(sorted(self.module_classes))
        if self.moving_classes:
            text += "\nmoving:" + ",".join(sorted(self.moving_classes))
        if self.call_facts:  # and whenever the cross-file call facts change
            from torchdoctor.check import project_facts

            text += "\n" + project_facts.digest(self.call_facts)
        return hashlib.sha1(text.encode()).hexdigest()[:16]

    def is_module_class_name(self, name: str) -> bool:
        return name.rsplit(".", 1)[-1] in self.module_classes or _base_is_torch_module(name)

    def is_module_class(self, cls: ast.ClassDef, ctx: FileContext) -> bool:
        if cls.name in self.module_classes:
            return True
        for base in cls.bases:
            qual = ctx.qualname(base)
            if qual is None:
                continue
            if qual.startswith("torch.nn.") and qual.rsplit(".", 1)[-1][:1].isupper():
                return True
            if self.is_module_class_name(qual):
                return True
        return False
