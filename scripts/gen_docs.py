"""Generate the reference pages of the docs site from the code (run by mkdocs-gen-files).

Every build reads the live sources, so a rule file or knowledge-base entry added later
gets its page without touching this script:

- `rules/index.md` and `rules/<CODE>.md` from `torchdoctor.catalog.catalog()` (static rules
  in `check/rules/`, runtime-only and engine codes in `catalog.py`). With mkdocs'
  directory URLs a page lands at `rules/<CODE>/`, which is what `catalog.DOCS_URL` links to.
- `reference/api.md`: a mkdocstrings block per public name in `torchdoctor._LAZY`.
- `explain/index.md` and `explain/<topic>.md` from the explain knowledge base
  (`explain/kb/*.toml`, loaded by `torchdoctor.explain.kb.entries()`).
- `guides/*.md` from sections of README.md (README_GUIDES), which each feature's
  author keeps current; links to repository files become plain text.

Run by hand (`python scripts/gen_docs.py OUT_DIR`) it writes the same pages into OUT_DIR.
"""

from __future__ import annotations

import collections
import re
import sys
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TextIO

import torchdoctor
from torchdoctor.catalog import RuleInfo, catalog
from torchdoctor.check.rule import FixAvailability
from torchdoctor.explain import kb

Opener = Callable[[str], AbstractContextManager[TextIO]]

KIND_TITLES = {
    "static": "Static rules (`torchdoctor check`)",
    "runtime": "Runtime-only codes (guard, `torchdoctor run`, explain)",
    "engine": "Checker codes",
}
FOUND_BY = {
    "static": "`torchdoctor check` (static, no torch needed)",
    "runtime": "`td.guard(model)`, `torchdoctor run` and `td.explain` at run time (no static rule)",
    "engine": "the checker itself",
}
GROUP_TEXT = {
    "bugs": "bugs: the code is wrong (on by default)",
    "advice": "advice: portability, performance or style (opt in: `--extend-select advice`)",
}
FIX_TEXT = {
    FixAvailability.NONE: "none",
    FixAvailability.SAFE: "safe: applied by `torchdoctor check --fix`",
    FixAvailability.UNSAFE: "unsafe: applied by `torchdoctor check --fix --unsafe-fixes`",
}


def _cell(text: str) -> str:
    """Text made safe for one Markdown table cell."""
    return " ".join(text.split()).replace("|", r"\|")


def _kb_by_code() -> dict[str, list[kb.Entry]]:
    found: dict[str, list[kb.Entry]] = collections.defaultdict(list)
    for entry in kb.entries():
        for code in entry.codes:
            found[code].append(entry)
    return found


# ---------------------------------------------------------------------------- rules


def rule_page(info: RuleInfo, errors: Iterable[kb.Entry]) -> str:
    summary, _, body = info.doc.partition("\n")
    lines = [
        f"# {info.code} · {info.name}",
        "",
        summary.strip(),
        "",
        "| | |",
        "|---|---|",
        f"| Category | {info.category} |",
        f"| Default severity | {info.severity.value} |",
        f"| Found by | {FOUND_BY.get(info.kind, info.kind)} |",
    ]
    if info.kind == "static":
        lines += [
            f"| Fix | {FIX_TEXT[info.fix]} |",
            f"| Group | {GROUP_TEXT.get(info.group, info.group)} |",
            f"| Enabled by default | {'yes' if info.default_enabled else 'no (opt in with `--extend-select`)'} |",  # noqa: E501
        ]
    lines += ["", body.strip(), ""]
    linked = list(errors)
    if linked:
        lines += [
            "## Errors it explains",
            "",
            "`torchdoctor explain` names this code as a cause of:",
            "",
        ]
        lines += [f"- [{e.title}](../explain/{e.topic}.md#{e.id})" for e in linked]
        lines.append("")
    if info.kind == "static":
        lines += [
            "## Silencing it",
            "",
            f"On one line: `# noqa: {info.code}`. For a project, in `pyproject.toml`:",
            "",
            "```toml",
            "[tool.torchdoctor]",
            f'ignore = ["{info.code}"]',
            "```",
            "",
        ]
    return "\n".join(lines)


def rules_index(entries: dict[str, RuleInfo]) -> str:
    lines = [
        "# Rules",
        "",
        "Every code torchdoctor reports, whichever way it is found. Codes are stable and "
        "never reused. `torchdoctor rule CODE` prints a rule's page in the terminal; "
        "`torchdoctor rules --all` lists them.",
        "",
    ]
    by_kind: dict[str, list[RuleInfo]] = collections.defaultdict(list)
    for info in entries.values():
        by_kind[info.kind].append(info)
    kinds = [k for k in KIND_TITLES if k in by_kind] + sorted(set(by_kind) - set(KIND_TITLES))
    for kind in kinds:
        lines += [f"## {KIND_TITLES.get(kind, kind)}", ""]
        if kind == "static":
            lines += [
                "| Code | Name | What it finds | Category | Severity | Fix |",
                "|---|---|---|---|---|---|",
            ]
            for info in by_kind[kind]:
                fix = info.fix.value if info.fix is not FixAvailability.NONE else ""
                lines.append(
                    f"| [{info.code}]({info.code}.md) | {info.name} | {_cell(info.summary)} "
                    f"| {info.category} | {info.severity.value} | {fix} |"
                )
        else:
            lines += ["| Code | Name | What it means |", "|---|---|---|"]
            for info in by_kind[kind]:
                lines.append(
                    f"| [{info.code}]({info.code}.md) | {info.name} | {_cell(info.summary)} |"
                )
        lines.append("")
    return "\n".join(lines)


def rules_nav(entries: dict[str, RuleInfo]) -> str:
    """The literate-nav file of the Rules section: the index, then one link per code."""
    lines = ["* [All rules](index.md)"]
    lines += [f"* [{info.code} {info.name}]({info.code}.md)" for info in entries.values()]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- API


def api_page() -> str:
    by_module: dict[str, list[str]] = collections.defaultdict(list)
    for name, module in torchdoctor._LAZY.items():
        by_module[module].append(name)
    lines = [
        "# Runtime API",
        "",
        "Everything below is reached as `td.NAME` after `import torchdoctor as td`. The "
        "import itself is cheap: each name is loaded on first use, and a missing torch "
        "raises `TorchNotInstalledError` with the command that installs it.",
        "",
    ]
    for module, names in by_module.items():
        lines += [f"## `{module}`", ""]
        for name in names:
            lines += [
                f"::: {module}.{name}",
                "    options:",
                f"      heading: td.{name}",
                "",
            ]
    lines += [
        "## Errors",
        "",
        "Every error torchdoctor raises on bad input derives from `TorchDoctorError` and "
        "carries a one-line cause and, where one exists, the fix.",
        "",
        "::: torchdoctor.errors",
        "    options:",
        "      show_root_heading: false",
        "      heading_level: 3",
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------- explain


_MARKDOWN_SPECIAL = re.compile(r"([\\*_\[\]])")


def _literal(text: str) -> str:
    return _MARKDOWN_SPECIAL.sub(r"\\\1", text).replace("<", "&lt;")


def _plain(text: str) -> str:
    """Knowledge-base prose as Markdown: `code spans` kept, everything else literal."""
    parts = re.split(r"(`[^`]*`)", text)
    return "".join(part if part.startswith("`") else _literal(part) for part in parts)


def _code_link(code: str, known: dict[str, RuleInfo], prefix: str) -> str:
    return f"[{code}]({prefix}rules/{code}.md)" if code in known else f"`{code}`"


def _fence(text: str, language: str = "") -> list[str]:
    # a fence longer than any backtick run inside, so the text cannot close it
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    ticks = "`" * max(3, longest + 1)
    return [f"{ticks}{language}", *text.split("\n"), ticks]


def explain_topic_page(topic: str, entries: list[kb.Entry], known: dict[str, RuleInfo]) -> str:
    lines = [f"# Explain: {topic} errors", ""]
    for entry in entries:
        codes = ", ".join(_code_link(c, known, "../") for c in entry.codes)
        lines += [f"## {_plain(entry.title)} {{ #{entry.id} }}", "", _plain(entry.summary), ""]
        if codes:
            lines += [f"Rule codes: {codes}", ""]
        if entry.examples:
            lines += ["**Messages it explains**", ""]
            for example in entry.examples:
                lines += [*_fence(example, "text"), ""]
        lines += ["**Likely causes**, most likely first:", ""]
        for number, cause in enumerate(entry.causes, 1):
            cause_codes = " ".join(_code_link(c, known, "../") for c in cause.codes)
            text = f"{number}. {_plain(cause.text)}" + (f" ({cause_codes})" if cause_codes else "")
            lines.append(text)
            if cause.tell:
                lines += ["", f"    *How to tell:* {_plain(cause.tell)}", ""]
        lines += ["", "**Fixes**", ""]
        for fix in entry.fixes:
            lines.append(f"- {_plain(fix.text)}")
            if fix.code:
                lines += ["", *("    " + line for line in _fence(fix.code, "python")), ""]
        lines.append("")
    return "\n".join(lines)


def explain_index(by_topic: dict[str, list[kb.Entry]], known: dict[str, RuleInfo]) -> str:
    total = sum(len(v) for v in by_topic.values())
    lines = [
        "# Explain catalogue",
        "",
        f"The {total} PyTorch errors `torchdoctor explain` and `td.explain(exc)` recognise, "
        "from its knowledge base (one TOML file per entry in `src/torchdoctor/explain/kb/`). "
        "Each entry matches old and new PyTorch wordings of one error and ranks its causes, "
        "each with the rule code that finds it before the code runs.",
        "",
        "```console",
        '$ torchdoctor explain "Expected all tensors to be on the same device, but found '
        'at least two devices, cuda:0 and cpu!"',
        "$ python train.py 2>&1 | torchdoctor explain -",
        "```",
        "",
        "| Error | Topic | Rule codes |",
        "|---|---|---|",
    ]
    for topic, entries in by_topic.items():
        for entry in entries:
            codes = ", ".join(_code_link(c, known, "../") for c in entry.codes)
            title = _cell(_plain(entry.title))
            lines.append(f"| [{title}]({topic}.md#{entry.id}) | {topic} | {codes} |")
    lines.append("")
    return "\n".join(lines)


def explain_by_topic() -> dict[str, list[kb.Entry]]:
    grouped: dict[str, list[kb.Entry]] = collections.defaultdict(list)
    for entry in kb.entries():
        grouped[entry.topic].append(entry)
    order = [t for t in kb.TOPICS if t in grouped] + sorted(set(grouped) - set(kb.TOPICS))
    return {topic: grouped[topic] for topic in order}


def explain_nav(by_topic: dict[str, list[kb.Entry]]) -> str:
    lines = ["* [All errors](index.md)"]
    lines += [f"* [{topic.capitalize()}]({topic}.md)" for topic in by_topic]
    return "\n".join(lines) + "\n"


# ---------------------------------------------------------------------------- guides

ROOT = Path(__file__).resolve().parents[1]
# Guide pages taken from the README, which each feature's author keeps current:
# page -> (title, README `## ` sections in order). A renamed section fails the build.
README_GUIDES: dict[str, tuple[str, tuple[str, ...]]] = {
    "guides/command-line.md": ("Command line", ("Command line",)),
    "guides/configuration.md": ("Configuration", ("Configuration", "Suppressing findings")),
    "guides/output-formats.md": ("Output formats", ("Output formats",)),
    "guides/runtime-library.md": ("Runtime library", ("Runtime library",)),
    "guides/guard-and-run.md": ("The guard and torchdoctor run", ("Guard", "torchdoctor run")),
    "guides/explain.md": ("Explain errors", ("Explain errors",)),
    "guides/virtual-accelerator.md": ("Virtual accelerator", ("Virtual accelerator",)),
    "guides/multi-gpu.md": ("Multi-GPU simulation", ("Multi-GPU simulation (torchrun)",)),
    "guides/nonfinite.md": ("NaN/Inf origin finder", ("NaN/Inf origin finder",)),
    "guides/pre-commit-and-flake8.md": ("pre-commit and flake8", ("pre-commit and flake8",)),
    "guides/editors.md": ("Editors", ("Editors",)),
}
# a Markdown link to a repository file (not a web page, not an anchor): kept as plain text
_RELATIVE_LINK = re.compile(r"\[([^\]]+)\]\((?!https?://|mailto:|#)[^)]*\)")


def readme_sections(text: str) -> dict[str, str]:
    """`## Title` -> the section's body, split outside code fences."""
    sections: dict[str, list[str]] = {}
    current: list[str] | None = None
    fence = ""
    for line in text.splitlines():
        stripped = line.lstrip()
        if fence:
            if stripped.startswith(fence):
                fence = ""
        elif stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
        elif line.startswith("## "):
            current = sections.setdefault(line[3:].strip(), [])
            continue
        elif line.startswith("# "):
            current = None
            continue
        if current is not None:
            current.append(line)
    return {title: "\n".join(lines).strip() + "\n" for title, lines in sections.items()}


def _plain_links(text: str) -> str:
    """Links to repository files become their text (outside code: `f[0](x)` is code)."""
    out: list[str] = []
    fence = ""
    for line in text.split("\n"):
        stripped = line.lstrip()
        if fence:
            fence = "" if stripped.startswith(fence) else fence
        elif stripped.startswith(("```", "~~~")):
            fence = stripped[:3]
        else:
            line = _RELATIVE_LINK.sub(r"\1", line)
        out.append(line)
    return "\n".join(out)


def readme_guide(title: str, names: tuple[str, ...], sections: dict[str, str]) -> str:
    missing = [name for name in names if name not in sections]
    if missing:
        raise SystemExit(
            f"gen_docs: README.md has no section {', '.join(f'## {m}' for m in missing)}; "
            "update README_GUIDES in scripts/gen_docs.py"
        )
    parts = [f"# {title}", ""]
    for index, name in enumerate(names):
        if index:
            parts += [f"## {name}", ""]
        parts += [_plain_links(sections[name]), ""]
    return "\n".join(parts)


# ---------------------------------------------------------------------------- driver


def generate(open_file: Opener) -> list[str]:
    """Write every generated page with `open_file(path)`; return the paths written."""
    pages: dict[str, str] = {}
    entries = catalog()
    errors_by_code = _kb_by_code()
    pages["rules/index.md"] = rules_index(entries)
    pages["rules/SUMMARY.md"] = rules_nav(entries)
    for code, info in entries.items():
        pages[f"rules/{code}.md"] = rule_page(info, errors_by_code.get(code, ()))
    pages["reference/api.md"] = api_page()
    by_topic = explain_by_topic()
    pages["explain/index.md"] = explain_index(by_topic, entries)
    pages["explain/SUMMARY.md"] = explain_nav(by_topic)
    for topic, topic_entries in by_topic.items():
        pages[f"explain/{topic}.md"] = explain_topic_page(topic, topic_entries, entries)
    sections = readme_sections((ROOT / "README.md").read_text(encoding="utf-8"))
    for path, (title, names) in README_GUIDES.items():
        pages[path] = readme_guide(title, names, sections)
    for path, text in pages.items():
        with open_file(path) as handle:
            handle.write(text)
    return list(pages)


def _write_to_folder(out: Path) -> None:
    def open_file(path: str) -> AbstractContextManager[TextIO]:
        target = out / path
        target.parent.mkdir(parents=True, exist_ok=True)
        return target.open("w", encoding="utf-8")

    for path in generate(open_file):
        print(out / path)


if __name__ == "<run_path>":  # run by mkdocs-gen-files inside `mkdocs build`
    import mkdocs_gen_files

    generate(lambda path: mkdocs_gen_files.open(path, "w"))
elif __name__ == "__main__":
    if len(sys.argv) != 2:
        raise SystemExit("usage: python scripts/gen_docs.py OUT_DIR")
    _write_to_folder(Path(sys.argv[1]))
