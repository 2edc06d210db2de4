"""Which project file a dotted module name means (beside the checked file, or the one
project path ending like it), and the record of the files a check looked at: the
results cache keys on them too."""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from torchdoctor.check.context import FileContext

# Files read as siblings while checking one file: the results cache keys on them too
# (see `recording_siblings`); a stack, because nothing stops a caller from nesting.
_READING: list[set[str]] = []


@contextlib.contextmanager
def recording_siblings() -> Iterator[set[str]]:
    """Collect the paths of the sibling files analysed inside the `with` block."""
    found: set[str] = set()
    _READING.append(found)
    try:
        yield found
    finally:
        _READING.pop()


def record_dependency(path: str) -> None:
    """Note that the findings being computed depend on the file at `path` (read, or
    looked for: a file that appears later changes them too)."""
    for reading in _READING:
        reading.add(os.path.abspath(path))


def sibling_path(ctx: FileContext, module: str, by_tail: bool = False) -> str | None:
    """The path of the file `sibling_file` would analyse (not read: a caller may judge
    its text first); recorded as a dependency when looked for beside the checked file."""
    level = len(module) - len(module.lstrip("."))
    parts = [p for p in module.lstrip(".").split(".") if p]
    if not parts or ctx.path in ("", "<stdin>"):
        return None
    base = os.path.dirname(os.path.abspath(ctx.path))
    bases = []
    if level:
        for _ in range(level - 1):
            base = os.path.dirname(base)
        bases.append(base)
    else:
        for _ in range(3):  # the script's folder and the package roots above it
            bases.append(base)
            base = os.path.dirname(base)
    for root in bases:
        stem = os.path.join(root, *parts)
        for candidate in (stem + ".py", os.path.join(stem, "__init__.py")):
            if os.path.isfile(candidate):
                if os.path.abspath(candidate) == os.path.abspath(ctx.path):
                    return None
                record_dependency(candidate)
                return candidate
    if level or not by_tail:
        return None
    return _by_tail(ctx, parts)


def _by_tail(ctx: FileContext, parts: list[str]) -> str | None:
    """The one project file whose path ends with the longest tail of `parts` (two parts
    at least: `utils/metrics.py` for `pkg.utils.metrics`); None where two files match.
    Once per run and module: every file importing it asks the same."""
    disk = ctx.project.disk
    key = "by_tail:" + ".".join(parts)
    if key not in disk:
        stems = disk.get("paths_by_stem")
        if not isinstance(stems, dict):
            stems = disk["paths_by_stem"] = _paths_by_stem(ctx.project.paths)
        disk[key] = _find_by_tail(stems.get(parts[-1], []), parts)
    found = disk[key]
    return found if isinstance(found, str) else None


def _paths_by_stem(paths: frozenset[str]) -> dict[str, list[str]]:
    """The project's paths by the module name they define (`metrics` for
    `utils/metrics.py` and `metrics/__init__.py`)."""
    found: dict[str, list[str]] = {}
    for path in paths:
        folder, _, name = path.rpartition("/")
        if name == "__init__.py":
            found.setdefault(folder.rpartition("/")[2], []).append(path)
        elif name.endswith(".py"):
            found.setdefault(name[:-3], []).append(path)
    return found


def _find_by_tail(paths: list[str], parts: list[str]) -> str | None:
    modules = {
        path: "/" + path.rsplit(".", 1)[0].removesuffix("/__init__")
        for path in paths
        if f"/{path}".endswith((f"/{parts[-1]}.py", f"/{parts[-1]}/__init__.py"))
    }
    for start in range(len(parts) - 1):
        tail = "/" + "/".join(parts[start:])
        matches = [path for path, module in modules.items() if module.endswith(tail)]
        if len(matches) == 1:
            return matches[0]
        if matches:
            return None
    return None
