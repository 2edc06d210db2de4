"""Whether a file belongs to a package the project distributes: a library.

A library's users pickle its models in code the library never sees (`torch.save(model)`,
multiprocessing spawn, framework checkpoints and worker processes), so what pickle
cannot store breaks there, not in the library's own code. TD405 and TD503 ask this of
a file where the program shows no pickling; it is read from the file system on first
request (the file's package folders and the packaging metadata beside the top one),
once per folder per run, and only for the files those rules ask about.

A distributed package: the file's folder and every folder up to the top package hold
an `__init__.py`, and the folder holding the top package (or the `src/` folder
holding it) has packaging metadata -- `setup.py`, a `setup.cfg` with a `[metadata]`
or `[options]` section, or a `pyproject.toml` with a `[project]` or `[tool.poetry]`
table (not one that configures tools only). Test, example, script, benchmark and
documentation folders are not shipped.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

from torchdoctor.check.analysis.module_paths import record_dependency
from torchdoctor.check.context import FileContext

# Folders of a repository that hold code around the package, not the package.
_NOT_SHIPPED = frozenset(
    {"tests", "test", "testing", "examples", "example", "scripts", "benchmarks", "docs"}
)
_METADATA = ("setup.py", "pyproject.toml", "setup.cfg")
_PYPROJECT_TABLE = re.compile(r"^\[(?:project|tool\.poetry)\]", re.MULTILINE)
_SETUP_CFG_SECTION = re.compile(r"^\[(?:metadata|options)\]", re.MULTILINE)


@dataclass(frozen=True)
class LibraryPackage:
    package: str  # the top package's name (`pytorch_metric_learning`)
    metadata: str  # the file that distributes it, relative to its folder's parent


def library_package(ctx: FileContext) -> LibraryPackage | None:
    """The distributed package `ctx`'s file belongs to, or None (once per file)."""
    return ctx.shared("library_package", lambda c: package_of(c.path, c.project.disk))


def package_of(path: str, disk: dict[str, object]) -> LibraryPackage | None:
    """The distributed package the file at `path` belongs to, or None; `disk` keeps what
    was read from the file system (the run's `ProjectIndex.disk`)."""
    if not path or path == "<stdin>":
        return None
    folder = os.path.dirname(os.path.abspath(path))
    chain: list[str] = []  # the package folders, innermost first
    while _is_package(folder, disk):
        chain.append(folder)
        parent = os.path.dirname(folder)
        if parent == folder:
            return None
        folder = parent
    if not chain or any(os.path.basename(f) in _NOT_SHIPPED for f in chain):
        return None
    top = chain[-1]
    holders = [folder]
    if os.path.basename(folder) == "src":  # the src layout: metadata one folder up
        holders.append(os.path.dirname(folder))
    for holder in holders:
        metadata = _metadata(holder, disk)
        if metadata is not None:
            inside = os.path.relpath(top, holder).split(os.sep)
            if any(part in _NOT_SHIPPED for part in inside):
                return None
            return LibraryPackage(os.path.basename(top), metadata)
    return None


def _is_package(folder: str, disk: dict[str, object]) -> bool:
    marker = os.path.join(folder, "__init__.py")
    record_dependency(marker)  # the finding changes when it appears or goes
    key = "file:" + marker
    if key not in disk:
        disk[key] = os.path.isfile(marker)
    return disk[key] is True


def _metadata(folder: str, disk: dict[str, object]) -> str | None:
    """The packaging file in `folder` that distributes packages, if one does."""
    for name in _METADATA:
        record_dependency(os.path.join(folder, name))
    key = "metadata:" + folder
    if key not in disk:
        disk[key] = _read_metadata(folder)
    found = disk[key]
    return found if isinstance(found, str) else None


def _read_metadata(folder: str) -> str | None:
    if os.path.isfile(os.path.join(folder, "setup.py")):
        return "setup.py"
    for name, table in (("pyproject.toml", _PYPROJECT_TABLE), ("setup.cfg", _SETUP_CFG_SECTION)):
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            continue
        try:
            with open(path, encoding="utf-8", errors="replace") as handle:
                text = handle.read(1_000_000)
        except OSError:
            continue
        if table.search(text):
            return name
    return None
