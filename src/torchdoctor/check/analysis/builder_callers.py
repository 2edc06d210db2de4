"""Files that move nothing themselves but hold what another project file's builder moved.

`model = create_model_config(cfg)` (create.py: `return model.to(get_device())`) then
`train_validate_test(model, optimizer, train_loader, ...)`: the script passes a model on
the device and a loader to a function of a third file without a `.to(` in its own text,
so the text gate of the cross-file call facts (`project_facts.is_candidate`) passes it
by. Such a file is a candidate when it calls a function it imports from a project file
whose text may make such a value (`made_results.makes`): judged on the texts alone, for
the few files that pass a loader on without moving anything.
"""

from __future__ import annotations

import ast
import re
import sys

from torchdoctor.check.analysis.made_results import makes
from torchdoctor.check.analysis.module_paths import sibling_path
from torchdoctor.check.context import FileContext
from torchdoctor.check.lines import as_lf
from torchdoctor.check.project import ProjectIndex

# `from pkg.models.create import create_model_config, build as make` (parenthesised too)
_FROM_IMPORT = re.compile(r"^[ \t]*from[ \t]+([\w.]+)[ \t]+import[ \t]+(\([^)]*\)|[^\r\n]*)", re.M)
_LIBRARIES = frozenset({"torch", "numpy", "torchvision", "transformers"})


def builder_callers(index: ProjectIndex, files: list[tuple[str, str]]) -> list[tuple[str, str]]:
    """The (path, text) pairs of `files` that call an imported project function whose
    text makes a moved module, a tensor on the device or a loader."""
    return [(path, source) for path, source in files if _calls_a_builder(index, path, source)]


def _calls_a_builder(index: ProjectIndex, path: str, source: str) -> bool:
    if not path or "import" not in source:
        return False
    ctx: FileContext | None = None
    for match in _FROM_IMPORT.finditer(as_lf(source)):  # (`^` matches after `\n` only)
        module = match.group(1)
        top = module.lstrip(".").partition(".")[0]
        if not module.startswith(".") and (top in _LIBRARIES or top in sys.stdlib_module_names):
            continue
        for name, local in _imported(match.group(2)):
            if f"{local}(" not in source:
                continue
            if ctx is None:  # only a path and the project are asked of it
                ctx = FileContext(path, source, ast.Module(body=[], type_ignores=[]), index)
            found = sibling_path(ctx, module, by_tail=True)
            if found is not None and makes(index.disk, found, name):
                return True
    return False


def _imported(names: str) -> list[tuple[str, str]]:
    """(name, local name) of each name an import's text binds (`a as b` -> ("a", "b"))."""
    found = []
    for part in re.sub(r"#[^\r\n]*", "", names).strip("()").replace("\\", " ").split(","):
        words = part.split()
        if len(words) == 1 and words[0].isidentifier():
            found.append((words[0], words[0]))
        elif len(words) == 3 and words[1] == "as":
            found.append((words[0], words[2]))
    return found
