"""benchmarks/_readme.py: generated README sections are replaced, everything else kept."""

from __future__ import annotations

import importlib.util
import re
import stat
import sys
from pathlib import Path

import pytest

_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "_readme.py"
_spec = importlib.util.spec_from_file_location("benchmarks_readme", _PATH)
assert _spec is not None and _spec.loader is not None
readme = importlib.util.module_from_spec(_spec)
sys.modules["benchmarks_readme"] = readme
_spec.loader.exec_module(readme)

HAND_WRITTEN = """## TD101 precision (judged by hand)

| corpus | findings | true | false |
|---|---:|---:|---:|
| torch | 10 | 9 | 1 |

Odd but kept: <!-- a comment -->, trailing spaces   , and a `## ` inside code:

```text
## not a heading
```
"""


def test_replaces_only_the_marked_text(tmp_path: Path) -> None:
    file = tmp_path / "README.md"
    readme.write_section("guard", "old numbers", heading="Guard overhead", readme=file)
    file.write_text(file.read_text() + "\n" + HAND_WRITTEN)
    readme.write_section("to_device", "old table", heading="to_device", readme=file)
    before = file.read_text()

    readme.write_section("guard", "new numbers\n\n| a |\n|---|", readme=file)
    after = file.read_text()
    assert "old numbers" not in after and "new numbers\n\n| a |\n|---|\n" in after
    # everything outside the guard markers is byte for byte what it was
    outside = r"<!-- begin: guard -->.*?<!-- end: guard -->"
    assert re.sub(outside, "", before, flags=re.S) == re.sub(outside, "", after, flags=re.S)
    assert HAND_WRITTEN in after and after.count("## Guard overhead") == 1


def test_absent_sections_are_added_at_the_end_or_under_the_title(tmp_path: Path) -> None:
    file = tmp_path / "README.md"
    file.write_text("# Benchmarks\n\nIntro written by hand.\n\n" + HAND_WRITTEN)
    readme.write_section("scaling", "a plot", heading="Check time vs tree size", readme=file)
    readme.write_section("header", "machine and versions", first=True, readme=file)
    text = file.read_text()
    assert text.startswith(
        "# Benchmarks\n\n<!-- begin: header -->\nmachine and versions\n<!-- end: header -->\n"
        "\nIntro written by hand.\n"
    )
    assert text.endswith(
        "\n## Check time vs tree size\n\n<!-- begin: scaling -->\na plot\n<!-- end: scaling -->\n"
    )
    assert HAND_WRITTEN in text


def test_a_hand_written_section_with_the_same_heading_is_left_alone(tmp_path: Path) -> None:
    file = tmp_path / "README.md"
    hand = "# Benchmarks\n\n## Check speed\n\nnumbers judged by hand\n\n" + HAND_WRITTEN
    file.write_text(hand)
    readme.write_section("check-speed", "generated", heading="Check speed", readme=file)
    assert file.read_text() == (
        hand + "\n## Check speed\n\n<!-- begin: check-speed -->\ngenerated\n"
        "<!-- end: check-speed -->\n"
    )


def test_heading_based_writers_do_not_swallow_the_next_marker(tmp_path: Path) -> None:
    # Other scripts replace "their `## heading` up to the next `## `"; markers sit below
    # the headings, so such a replacement ends before the next section's begin marker.
    file = tmp_path / "README.md"
    file.write_text("# Benchmarks\n\n## Virtual accelerator\n\nold\n")
    readme.write_section("guard", "guard table", heading="Guard overhead", readme=file)
    text = file.read_text()
    start = text.index("## Virtual accelerator\n")
    end = start + text[start:].index("\n## ", 1) + 1
    file.write_text(text[:start] + "## Virtual accelerator\n\nnew\n\n" + text[end:])
    readme.write_section("guard", "guard table 2", readme=file)
    assert "new\n\n## Guard overhead\n\n<!-- begin: guard -->\nguard table 2\n" in file.read_text()


def test_writes_are_atomic_and_keep_the_file_readable(tmp_path: Path) -> None:
    file = tmp_path / "README.md"
    file.write_text("# Benchmarks\n")
    file.chmod(0o644)
    readme.write_section("a", "x", readme=file)
    assert stat.S_IMODE(file.stat().st_mode) == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["README.md"]  # no temp file left


def test_a_broken_marker_pair_is_an_error_not_a_guess(tmp_path: Path) -> None:
    file = tmp_path / "README.md"
    file.write_text("# Benchmarks\n\n<!-- begin: guard -->\nno end marker\n")
    with pytest.raises(ValueError, match="without"):
        readme.write_section("guard", "x", readme=file)
    assert file.read_text() == "# Benchmarks\n\n<!-- begin: guard -->\nno end marker\n"
    with pytest.raises(ValueError, match="section names"):
        readme.write_section("two words", "x", readme=file)
