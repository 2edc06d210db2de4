"""The documentation site builds with `mkdocs build --strict` and covers the live catalogue.

One build (a few seconds) is shared by every test here: it fails on any broken link,
missing anchor or docstring the API reference cannot render.
"""

from __future__ import annotations

import html
import os
import re
import runpy
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import torchdoctor
from torchdoctor.catalog import DOCS_URL, catalog
from torchdoctor.explain import kb

pytest.importorskip(
    "mkdocs", reason="mkdocs is not installed: pip install -e '.[docs]' (make docs does it)"
)

ROOT = Path(__file__).resolve().parents[1]
SITE_URL = "https://torchdoctor.readthedocs.io/en/latest/"

pytestmark = pytest.mark.xdist_group("docs")


@pytest.fixture(scope="session")  # one build per test process
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("site")
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "DISABLE_MKDOCS_2_WARNING": "true"}
    proc = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    return out


def _text(page: Path) -> str:
    """The visible text of a built page (tags stripped, entities decoded)."""
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text(encoding="utf-8")))


def _words(text: str) -> str:
    return " ".join(text.split())


def test_every_code_has_a_page_where_docs_url_points(site: Path) -> None:
    for code, info in catalog().items():
        url = DOCS_URL.format(code=code)
        assert url.startswith(SITE_URL)
        page = site / url.removeprefix(SITE_URL) / "index.html"
        assert page.is_file(), f"{code}: {url} has no page"
        text = _text(page)
        assert f"{code} · {info.name}" in text
        assert info.summary.replace("`", "") in text


def test_rules_index_lists_every_code(site: Path) -> None:
    index = (site / "rules" / "index.html").read_text(encoding="utf-8")
    for code in catalog():
        assert f'href="{code}/"' in index, code


def test_rule_page_shows_its_sections_and_the_errors_it_explains(site: Path) -> None:
    text = _text(site / "rules" / "TD402" / "index.html")
    for heading in ("What it does", "Why is this bad?", "Example", "Use instead"):
        assert heading in text
    assert "# noqa: TD402" in text
    linked = [e for e in kb.entries() if "TD402" in e.codes]
    assert linked, "the knowledge base names TD402 as a cause"
    for entry in linked:
        assert entry.title in text
    assert "bugs: the code is wrong (on by default)" in text
    advice = _text(site / "rules" / "TD114" / "index.html")
    assert "advice: portability, performance or style" in advice


def test_explain_catalogue_has_every_entry(site: Path) -> None:
    for entry in kb.entries():
        page = site / "explain" / entry.topic / "index.html"
        source = page.read_text(encoding="utf-8")
        assert f'id="{entry.id}"' in source, entry.id
        words = _words(_text(page))  # Markdown turns tabs in code blocks into spaces
        for example in entry.examples:
            assert _words(example) in words, f"{entry.id}: example missing"
        for cause in entry.causes:
            assert _words(cause.text.replace("`", "")) in words, f"{entry.id}: cause missing"
    index = _text(site / "explain" / "index.html")
    assert f"The {len(kb.entries())} PyTorch errors" in index


def test_api_reference_renders_every_public_name(site: Path) -> None:
    source = (site / "reference" / "api" / "index.html").read_text(encoding="utf-8")
    for name, module in torchdoctor._LAZY.items():
        assert f'id="{module}.{name}"' in source, f"td.{name} is not documented"
    text = _text(site / "reference" / "api" / "index.html")
    # the docstring itself is rendered, not just the heading
    assert "Save the state of" in text
    assert "CheckpointError" in text


def test_hand_written_pages_are_built(site: Path) -> None:
    for page in (
        "getting-started/install",
        "getting-started/quickstart",
        "getting-started/three-ways",
        "guides/ci",
    ):
        assert (site / page / "index.html").is_file(), page
    ci = _text(site / "guides" / "ci" / "index.html")
    assert "github/codeql-action/upload-sarif" in ci
    assert "--format sarif" in ci


def _generator() -> dict[str, Any]:
    return runpy.run_path(str(ROOT / "scripts" / "gen_docs.py"), run_name="gen_docs")


def test_guides_are_the_readme_sections(site: Path) -> None:
    gen = _generator()
    sections = gen["readme_sections"]((ROOT / "README.md").read_text(encoding="utf-8"))
    for path, (_, names) in gen["README_GUIDES"].items():
        page = " ".join(re.findall(r"\w+", _text(site / path.removesuffix(".md") / "index.html")))
        for name in names:
            # the words of the section's first line (link targets are not shown)
            first = next(
                line
                for line in sections[name].splitlines()
                if line.strip() and not line.startswith("```")
            )
            words = " ".join(re.findall(r"\w+", re.sub(r"\]\([^)]*\)", "", first)))
            assert words in page, (path, name)


def test_readme_sections_split_outside_code_and_keep_code_links() -> None:
    gen = _generator()
    text = (
        "# Title\n\n## One\n\ntext [a file](src/x.py) and [web](https://x.org)\n"
        "```python\n## not a heading\ny = f[0](x)\n```\n## Two\nbody\n"
    )
    sections = gen["readme_sections"](text)
    assert list(sections) == ["One", "Two"]
    assert "## not a heading" in sections["One"]
    page = gen["readme_guide"]("Guide", ("One", "Two"), sections)
    assert "text a file and [web](https://x.org)" in page
    assert "y = f[0](x)" in page
    assert page.startswith("# Guide\n") and "\n## Two\n" in page
    with pytest.raises(SystemExit, match="no section ## Three"):
        gen["readme_guide"]("Guide", ("Three",), sections)


def test_navigation_files_are_not_published(site: Path) -> None:
    assert not list(site.rglob("SUMMARY*"))
    assert "guides/editors/" in (site / "index.html").read_text(encoding="utf-8")


def test_the_hosting_configuration_builds_the_site_the_links_point_at() -> None:
    mkdocs_yml = (ROOT / "mkdocs.yml").read_text(encoding="utf-8")
    assert f"site_url: {SITE_URL}" in mkdocs_yml
    assert DOCS_URL.startswith(SITE_URL)
    rtd = (ROOT / ".readthedocs.yaml").read_text(encoding="utf-8")
    assert "configuration: mkdocs.yml" in rtd
    assert "extra_requirements: [docs]" in rtd
    assert "readthedocs.io" in SITE_URL  # the host the configuration is for
