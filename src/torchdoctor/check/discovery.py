"""Which files a run checks: walk folders, honour excludes and what git ignores.

Git's ignore rules are read from the `.gitignore` files themselves (and
`.git/info/exclude`) with the `pathspec` library rather than by asking
`git check-ignore`: that needs no git binary (a source tarball, a slim Docker
image), costs no subprocess, and lets the walk prune an ignored folder before
entering it. The one difference: the user's global excludes file
(`core.excludesFile`) is not read. Outside a git work tree nothing is ignored,
as for git itself.
"""

from __future__ import annotations

import os
from collections.abc import Iterator, Sequence
from pathlib import Path

import pathspec

from torchdoctor.check.config import Settings

SOURCE_SUFFIXES = (".py", ".pyi", ".ipynb")

# One folder's ignore rules: (the folder they are relative to, the compiled patterns).
_Rules = tuple[Path, pathspec.GitIgnoreSpec]


def _read_spec(file: Path) -> pathspec.GitIgnoreSpec | None:
    try:
        lines = file.read_text(encoding="utf-8", errors="replace").splitlines()
    except OSError:
        return None
    spec = pathspec.GitIgnoreSpec.from_lines(lines)
    return spec if len(spec) else None


def find_git_root(start: Path) -> Path | None:
    """The work tree containing `start` (a folder with a `.git` entry), or None."""
    for folder in (start, *start.parents):
        if (folder / ".git").exists():
            return folder
    return None


class GitIgnore:
    """The ignore rules of every folder seen, each applying below its own folder."""

    def __init__(self) -> None:
        # folder -> (inside a git work tree?, rules applying inside it, outermost first)
        self._folders: dict[Path, tuple[bool, list[_Rules]]] = {}

    def rules_for(self, folder: Path) -> list[_Rules]:
        """Rules that apply inside `folder` (absolute), outermost first."""
        return self._lookup(folder)[1]

    def _lookup(self, folder: Path) -> tuple[bool, list[_Rules]]:
        cached = self._folders.get(folder)
        if cached is not None:
            return cached
        rules: list[_Rules] = []
        if (folder / ".git").exists():
            inside = True
            exclude = _read_spec(folder / ".git" / "info" / "exclude")
            if exclude is not None:
                rules.append((folder, exclude))
        elif folder.parent == folder:
            inside = False  # reached the top without meeting a work tree
        else:
            inside, parent_rules = self._lookup(folder.parent)
            rules = list(parent_rules)
        if inside:
            own = _read_spec(folder / ".gitignore")
            if own is not None:
                rules.append((folder, own))
        self._folders[folder] = (inside, rules)
        return inside, rules

    def ignored(self, path: Path, *, is_dir: bool) -> bool:
        """Whether git ignores `path` (absolute). A deeper .gitignore overrides a shallower one."""
        for base, spec in reversed(self.rules_for(path.parent)):
            rel = path.relative_to(base).as_posix() + ("/" if is_dir else "")
            if not hasattr(spec, "check_file"):  # pathspec < 1.0: no "negated" answer
                if spec.match_file(rel):
                    return True
                continue
            result = spec.check_file(rel)
            if result.include is not None:
                return bool(result.include)
        return False


def discover(paths: Sequence[Path], settings: Settings) -> Iterator[Path]:
    """Files to check, in a stable order.

    Files named explicitly are always checked (unless `force_exclude`); folders are
    walked for `.py`, `.pyi` and `.ipynb` files, skipping excluded and git-ignored
    entries.
    """
    seen: set[Path] = set()
    gitignore = GitIgnore() if settings.respect_gitignore else None
    walk_ignore: GitIgnore | None = None  # per named folder: None inside an ignored one

    def skipped(entry: Path, is_dir: bool) -> bool:
        if settings.excluded_entry(entry):
            return True
        return walk_ignore is not None and walk_ignore.ignored(entry.absolute(), is_dir=is_dir)

    for path in paths:
        # anything named that is not a folder (a file, a FIFO, a looping link) is read,
        # and reading reports what is wrong with it
        if not path.is_dir():
            if settings.force_exclude and (
                settings.is_excluded(path)
                or (gitignore is not None and _ignored_with_parents(gitignore, path))
            ):
                continue
            if path not in seen:
                seen.add(path)
                yield path
            continue
        if settings.force_exclude and settings.is_excluded(path):
            continue
        # A folder the user names inside a git-ignored one (`.venv/lib/.../torch`) is
        # walked as asked; .gitignore still applies inside folders that git tracks.
        walk_ignore = gitignore
        if gitignore is not None and _ignored_with_parents(gitignore, path, is_dir=True):
            walk_ignore = None
        for folder, dirnames, filenames in os.walk(path):
            here = Path(folder)
            dirnames[:] = sorted(d for d in dirnames if not skipped(here / d, True))
            for name in sorted(filenames):
                if name.endswith(SOURCE_SUFFIXES):
                    file = here / name
                    if file not in seen and not skipped(file, False):
                        seen.add(file)
                        yield file


def _ignored_with_parents(gitignore: GitIgnore, path: Path, *, is_dir: bool = False) -> bool:
    """Whether git ignores a file or folder, or one of the folders it sits in."""
    absolute = path.absolute()
    if absolute.parent != absolute and gitignore.ignored(absolute, is_dir=is_dir):
        return True
    for parent in absolute.parents:
        if parent.parent == parent or (parent / ".git").exists():
            break
        if gitignore.ignored(parent, is_dir=True):
            return True
    return False
