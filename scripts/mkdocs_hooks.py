"""mkdocs hooks: the generated SUMMARY.md navigation files are read, never published."""

from __future__ import annotations

from typing import Any

from mkdocs.structure.files import Files, InclusionLevel


def on_files(files: Files, config: Any) -> Files:
    for file in files:
        if file.src_uri.endswith("SUMMARY.md"):
            file.inclusion = InclusionLevel.EXCLUDED
    return files
