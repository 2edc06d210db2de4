"""The newest torch a project's own dependency pins allow, for version-dependent rules.

Like ruff reading `requires-python`, `check` reads what the project declares when no
`target-version` is configured: pyproject.toml, setup.py, setup.cfg, requirements*.txt
and environment*.yml (pin_files.py reads them). The project is the nearest folder at
or above the file holding one of them (a folder with `.git` ends the search).

Every torch requirement found counts (their union): the project supports a version if
any of its declarations allows it. So a rule is quieted only where every declaration
excludes the versions it is about (`torch>=1.10,<2` in setup.py and no newer pin
anywhere). A requirement without an upper bound, one that cannot be read, or a list
setup.py computes in a way that cannot be followed leaves the ceiling open: today's
torch, as with no pins at all.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass

_PROJECT_FILES = frozenset({"pyproject.toml", "setup.py", "setup.cfg"})
# A file that names torch, or a `.txt` file holding requirements that may: only then is
# it parsed (and `packaging` imported)
_MAY_PIN = re.compile(r"(?<![\w-])(?:py)?torch(?![\w-])|\.txt\b", re.IGNORECASE)


@dataclass(frozen=True)
class TorchCeiling:
    """The project's pins allow torch up to the `newest` (major, minor) release only
    (minor 999: any minor of that major, as `<2` allows every 1.x); `source` is the
    file that pins it."""

    newest: tuple[int, int]
    source: str = ""

    def allows_at_least(self, major: int, minor: int) -> bool:
        """Whether some version the pins allow is `major.minor` or newer."""
        return (major, minor) <= self.newest


def is_project_file(name: str) -> bool:
    """A dependency file `check` reads."""
    return (
        name in _PROJECT_FILES
        or (name.startswith("requirements") and name.endswith(".txt"))
        or (name.startswith("environment") and name.endswith((".yml", ".yaml")))
    )


def folder_ceiling(folder: str, names: list[str]) -> TorchCeiling | None:
    """The torch ceiling the dependency files `names` in `folder` declare (None: open)."""
    texts = []
    for name in names:
        try:
            with open(os.path.join(folder, name), encoding="utf-8", errors="replace") as handle:
                texts.append(handle.read())
        except OSError:
            continue
    if not any(_MAY_PIN.search(text) for text in texts):
        return None  # nothing about torch: no need to parse (or to import `packaging`)
    from torchdoctor.check.pin_files import folder_bound

    bound = folder_bound(folder, names)
    return None if bound is None else TorchCeiling(bound[0], bound[1])


class PinsFinder:
    """Answers `ceiling_for(path)` for the files of a run, reading each folder once."""

    def __init__(self) -> None:
        self._folders: dict[str, TorchCeiling | None] = {}

    def ceiling_for(self, path: str) -> TorchCeiling | None:
        """The torch ceiling of the project `path` belongs to (None: open)."""
        folder = os.path.dirname(os.path.abspath(path))
        walked: list[str] = []
        result: TorchCeiling | None = None
        while True:
            if folder in self._folders:
                result = self._folders[folder]
                break
            walked.append(folder)
            try:
                names = os.listdir(folder)
            except OSError:
                names = []
            found = sorted(n for n in names if is_project_file(n))
            if found:
                result = folder_ceiling(folder, found)
                break
            parent = os.path.dirname(folder)
            if parent == folder or ".git" in names:
                break
            folder = parent
        for seen in walked:
            self._folders[seen] = result
        return result
