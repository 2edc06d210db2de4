"""The torch requirements a project's dependency files declare, as bounds.

pyproject.toml (`[project]` dependencies and optional dependencies, dependency groups,
setuptools' dynamic files, Poetry's tables), setup.py (setup_requirements.py),
setup.cfg, pip requirements files (with their `-r` / `-c` files) and conda
environment files. torch_pins.py finds the files and combines what they say.
"""

from __future__ import annotations

import configparser
import fnmatch
import os
import re
import sys
from collections.abc import Iterable, Iterator
from urllib.parse import unquote

from packaging.requirements import InvalidRequirement, Requirement
from packaging.specifiers import InvalidSpecifier, Specifier, SpecifierSet
from packaging.version import InvalidVersion, Version

from torchdoctor.check.setup_requirements import setup_py_requirements

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on 3.10 only
    import tomli as tomllib

# `pytorch` is torch's conda name (a dead name on PyPI, but written for torch there too)
_TORCH_NAMES = frozenset({"torch", "pytorch"})
_NAMES_TORCH = re.compile(r"\s*(?:[\w.-]+::)?(?:py)?torch\b(?![\w.-])", re.IGNORECASE)
_WHEEL_VERSION = re.compile(r"(?:^|/)torch-([0-9][^-/]*)-[^/]*\.whl", re.IGNORECASE)
_MAX_INCLUDES = 8  # `-r` files followed from one requirements file (loops, deep chains)

# The newest torch minor release a file's pins allow (999: any minor of a major, as for
# `<2`) and the file; None where they allow any newer torch.
Bound = tuple[tuple[int, int], str] | None


def _newest_minor(version: Version, inclusive: bool) -> tuple[int, int]:
    """The newest `major.minor` with a version at or below (`inclusive`) or below
    `version`: `<2.4` 2.3, `<=2.4` and `<2.4.1` 2.4, `<2` 1.999, `<2.4.0rc1` 2.3."""
    major, minor = (*version.release, 0)[:2]
    first = Version(f"{major}.{minor}")
    if version >= first if inclusive else version > first:
        return major, minor
    return (major, minor - 1) if minor else (major - 1, 999)


def specifier_bound(specifiers: SpecifierSet, source: str = "") -> Bound:
    """The lowest upper bound of the specifiers (all must hold), or None if unbounded."""
    bounds = [b for spec in specifiers if (b := _one_bound(spec, source)) is not None]
    return min(bounds) if bounds else None


def _one_bound(spec: Specifier, source: str) -> Bound:
    op, text = spec.operator, spec.version
    try:
        if op in ("<", "<="):
            return _newest_minor(Version(text), op == "<="), source
        if op in ("==", "===") and text.endswith(".*"):
            return _prefix_bound(Version(text[:-2]).release, source)
        if op in ("==", "==="):
            return _newest_minor(Version(text), True), source
        if op == "~=":  # ~=1.10 is >=1.10,==1.*; ~=1.10.2 is >=1.10.2,==1.10.*
            return _prefix_bound(Version(text).release[:-1], source)
    except InvalidVersion:
        return None  # `=== foo`: no version to compare with
    return None  # >, >=, !=


def _prefix_bound(release: tuple[int, ...], source: str) -> Bound:
    """`==1.10.*`: 1.10; `==1.*`: any 1.x."""
    return ((release[0], release[1]) if len(release) > 1 else (release[0], 999)), source


def union(bounds: Iterable[Bound]) -> Bound:
    """The highest of the bounds (None if any is open, or there are none)."""
    highest: Bound = None
    for bound in bounds:
        if bound is None:
            return None
        if highest is None or bound[0] > highest[0]:
            highest = bound
    return highest


# -- requirement texts ------------------------------------------------------------------
def requirement_bounds(text: str, source: str) -> Iterator[Bound]:
    """The bound of one PEP 508 requirement if it names torch (else nothing)."""
    try:
        requirement = Requirement(text.strip())
    except InvalidRequirement:
        wheel = _WHEEL_VERSION.search(unquote(text))
        if wheel is not None:  # a wheel's address or path: its file name says the version
            yield _exact(wheel.group(1), source)
        elif _NAMES_TORCH.match(text):
            yield None  # torch, written in a way we cannot read
        return
    if requirement.name.lower() not in _TORCH_NAMES:
        return
    if requirement.url:
        wheel = _WHEEL_VERSION.search(unquote(requirement.url))
        yield _exact(wheel.group(1), source) if wheel else None
        return
    yield specifier_bound(requirement.specifier, source)


def _exact(version: str, source: str) -> Bound:
    try:
        return _newest_minor(Version(version), True), source
    except InvalidVersion:
        return None


def requirements_file_bounds(path: str, seen: set[str] | None = None) -> Iterator[Bound]:
    """The torch requirements of a pip requirements file and the `-r` / `-c` files it
    names (one missing from the project declares nothing: pip could not read it either).
    `seen` is None for a file setup.py reads: missing, it is a path we failed to follow."""
    text = _read(path)
    if text is None:
        if seen is None:
            yield None  # a file setup.py names that we could not find: unknown
        return
    seen = set() if seen is None else seen
    real = os.path.realpath(path)
    if real in seen or len(seen) > _MAX_INCLUDES:
        return
    seen.add(real)
    for line in text.replace("\\\n", "").splitlines():
        line = re.sub(r"(^|\s)#.*", "", line).strip()
        include = re.match(r"(?:-r|-c|--requirement|--constraint)(?:\s*=?\s*)(\S+)", line)
        if include:
            named = os.path.join(os.path.dirname(path), include.group(1))
            yield from requirements_file_bounds(named, seen)
            continue
        if not line or line.startswith("-"):
            continue  # -e ., --index-url, -f: no torch pin
        # pip's per-line options (`--hash=...`, `-f url`) follow the requirement
        line = re.split(r"\s+-", line, maxsplit=1)[0]
        yield from requirement_bounds(line, path)


def _read(path: str) -> str | None:
    try:
        with open(path, encoding="utf-8", errors="replace") as handle:
            return handle.read()
    except OSError:
        return None


# -- pyproject.toml ---------------------------------------------------------------------
def pyproject_bounds(path: str) -> Iterator[Bound]:
    text = _read(path)
    if text is None:
        return
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError:
        return  # a broken pyproject.toml declares nothing pip could install either
    project = _table(data.get("project"))
    for item in _strings(project.get("dependencies")):
        yield from requirement_bounds(item, path)
    for group in _table(project.get("optional-dependencies")).values():
        for item in _strings(group):
            yield from requirement_bounds(item, path)
    for group in _table(data.get("dependency-groups")).values():
        for item in _strings(group):
            yield from requirement_bounds(item, path)
    tool = _table(data.get("tool"))
    # `dynamic = ["dependencies"]` read from files by setuptools
    dynamic = _table(_table(tool.get("setuptools")).get("dynamic"))
    folder = os.path.dirname(path)
    for entry in (
        dynamic.get("dependencies"),
        *_table(dynamic.get("optional-dependencies")).values(),
    ):
        for name in _strings(_table(entry).get("file")):
            yield from requirements_file_bounds(os.path.join(folder, name))
    yield from _poetry_bounds(_table(tool.get("poetry")), path)


def _table(value: object) -> dict[str, object]:
    return value if isinstance(value, dict) else {}


def _strings(value: object) -> list[str]:
    if isinstance(value, str):
        return [value]
    return [v for v in value if isinstance(v, str)] if isinstance(value, list) else []


def _poetry_bounds(poetry: dict[str, object], source: str) -> Iterator[Bound]:
    tables = [poetry.get("dependencies"), poetry.get("dev-dependencies")]
    tables += [_table(g).get("dependencies") for g in _table(poetry.get("group")).values()]
    for table in tables:
        for name, value in _table(table).items():
            if name.lower() not in _TORCH_NAMES:
                continue
            for entry in value if isinstance(value, list) else [value]:
                constraint = entry if isinstance(entry, str) else _table(entry).get("version")
                if not isinstance(constraint, str):
                    yield None  # a git, path or url source: any version
                    continue
                for alternative in constraint.split("||"):
                    yield _poetry_bound(alternative.strip(), source)


def _poetry_bound(constraint: str, source: str) -> Bound:
    """One Poetry constraint: `^1.10`, `~1.10`, `1.10.*`, `>=1.10,<2`, or a bare version."""
    lowest: list[Bound] = []
    for part in re.split(r"\s*,\s*|\s+(?=[<>=!~^])", constraint.strip()):
        if not part or part == "*":
            continue
        if part[0] in "^~" and part[:2] != "~=":
            try:
                release = Version(part[1:].strip()).release
            except InvalidVersion:
                return None
            if part[0] == "^":  # up to the first non-zero part: ^1.10 <2, ^0.4 <0.5
                keep = next((i for i, n in enumerate(release) if n), len(release) - 1) + 1
            else:  # ~1.10 <1.11, ~1 <2
                keep = 2 if len(release) > 1 else 1
            lowest.append(_prefix_bound(release[:keep], source))
            continue
        if part[0].isdigit():
            part = "==" + part
        try:
            lowest.append(specifier_bound(SpecifierSet(part), source))
        except InvalidSpecifier:
            return None
    bounded = [c for c in lowest if c is not None]
    if not bounded:
        return None
    return min(bounded)


# -- setup.cfg, environment.yml ---------------------------------------------------------
def setup_cfg_bounds(path: str) -> Iterator[Bound]:
    parser = configparser.ConfigParser(interpolation=None)
    try:
        parser.read(path, encoding="utf-8")
    except (configparser.Error, UnicodeDecodeError):
        return
    values = []
    if parser.has_option("options", "install_requires"):
        values.append(parser.get("options", "install_requires"))
    if parser.has_section("options.extras_require"):
        values += [value for _, value in parser.items("options.extras_require")]
    folder = os.path.dirname(path)
    for value in values:
        if value.strip().startswith("file:"):
            for name in value.strip()[5:].split(","):
                yield from requirements_file_bounds(os.path.join(folder, name.strip()))
            continue
        for line in value.splitlines():
            line = line.split("#", 1)[0].strip()
            if line:
                yield from requirement_bounds(line, path)


_CONDA_ITEM = re.compile(r"\s*-\s+['\"]?(?:[\w.-]+::)?([A-Za-z0-9_.-]+)\s*([^'\"#]*)")


def environment_bounds(path: str) -> Iterator[Bound]:
    """Conda's `- pytorch=1.10`, `- pytorch==1.10.0=py3.8_cuda11`, `- pytorch>=1.8,<2`,
    `- pytorch 1.10.*`, and `- torch==2.0` under `pip:`."""
    text = _read(path)
    if text is None:
        return
    for line in text.splitlines():
        match = _CONDA_ITEM.match(line)
        if match is None or match.group(1).lower() not in _TORCH_NAMES:
            continue
        spec = match.group(2).strip()
        if not spec:
            yield None
            continue
        for alternative in spec.split("|"):
            yield _conda_bound(alternative.strip(), path)


def _conda_bound(spec: str, source: str) -> Bound:
    if spec[:1] == "=" and spec[:2] != "==":  # `=1.10` is 1.10.* (a build may follow)
        spec = spec[1:].split("=", 1)[0]
        spec = "==" + (spec if spec.endswith("*") else spec + ".*")
    elif spec[:2] == "==":
        spec = "==" + spec[2:].split("=", 1)[0]
    elif spec[:1].isdigit():  # `pytorch 1.10.*` or `pytorch 1.10 build`: a prefix
        version = spec.split()[0]
        spec = "==" + (version if version.endswith("*") else version + ".*")
    try:
        return specifier_bound(SpecifierSet(spec.split()[0]), source)
    except InvalidSpecifier:
        return None


# -- the project ------------------------------------------------------------------------
def folder_bound(folder: str, names: Iterable[str]) -> Bound:
    """The torch bound of the dependency files `names` in `folder` (None: open)."""
    bounds: list[Bound] = []
    for name in sorted(names):
        path = os.path.join(folder, name)
        if name == "pyproject.toml":
            bounds += pyproject_bounds(path)
        elif name == "setup.py":
            found = setup_py_requirements(_read(path) or "")
            if found is None:
                bounds.append(None)  # computed in a way we cannot follow: any torch
                continue
            texts, files = found
            for text in texts:
                bounds += requirement_bounds(text, path)
            for named in files:
                bounds += requirements_file_bounds(_requirements_path(folder, named))
        elif name == "setup.cfg":
            bounds += setup_cfg_bounds(path)
        elif _is_requirements(name):
            bounds += requirements_file_bounds(path)
        elif _is_environment(name):
            bounds += environment_bounds(path)
    return union(bounds)


def _requirements_path(folder: str, named: str) -> str:
    """A file setup.py reads: as written from the project folder, or, when that is
    only a base name joined to a folder (`os.path.join(REQS, "base.txt")`), in a
    requirements folder of the project."""
    path = os.path.join(folder, named)
    if os.path.isfile(path) or "/" in named:
        return path
    for sub in ("requirements", "requirement", "reqs"):
        candidate = os.path.join(folder, sub, named)
        if os.path.isfile(candidate):
            return candidate
    return path


def _is_requirements(name: str) -> bool:
    return name.startswith("requirements") and name.endswith(".txt")


def _is_environment(name: str) -> bool:
    return fnmatch.fnmatch(name, "environment*.y*ml")
