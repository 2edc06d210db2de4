"""Replace one `### subsection` of the `## Robustness` section in benchmarks/README.md.

Only that subsection is rewritten; everything else in the file (other scripts' sections)
is kept as it is. The write is atomic (temp file + rename).
"""

from __future__ import annotations

import os
import re
import tempfile
from pathlib import Path

README = Path(__file__).resolve().parent / "README.md"
SECTION = "## Robustness"
INTRO = (
    "The robustness campaign of issue 8: the scripts below record their results here; the "
    "fast versions of the same checks run in the test suite (`tests/robustness/`).\n"
)


def _atomic_write(path: Path, text: str) -> None:
    fd, temp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temp, path)
    except BaseException:
        Path(temp).unlink(missing_ok=True)
        raise


def write_subsection(title: str, body: str, readme: Path = README) -> None:
    """Put `### title` + body under `## Robustness`, replacing an older version of it."""
    text = readme.read_text(encoding="utf-8") if readme.exists() else "# Benchmarks\n"
    block = f"### {title}\n\n{body.strip()}\n"
    start = text.find(f"\n{SECTION}\n")
    if start < 0:
        text = text.rstrip("\n") + f"\n\n{SECTION}\n\n{INTRO}\n{block}"
        _atomic_write(readme, text)
        return
    body_start = start + len(SECTION) + 2
    following = re.search(r"^## ", text[body_start:], re.M)
    end = body_start + following.start() if following else len(text)
    section = text[body_start:end]
    heading = re.search(rf"^### {re.escape(title)}\n", section, re.M)
    if heading:
        rest = re.search(r"^#{2,3} ", section[heading.end() :], re.M)
        stop = heading.end() + rest.start() if rest else len(section)
        section = section[: heading.start()] + block + ("\n" if rest else "") + section[stop:]
    else:
        section = section.rstrip("\n") + "\n\n" + block + ("\n" if following else "")
    _atomic_write(readme, text[:body_start] + section + text[end:])
