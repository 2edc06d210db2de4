"""`torchdoctor server` driven by a real LSP client (pytest-lsp) over stdio."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

import pytest
import pytest_lsp
from lsprotocol import types
from pytest_lsp import ClientServerConfig, LanguageClient, client_capabilities

pytestmark = pytest.mark.asyncio(loop_scope="module")

TRAIN = """\
import torch
from torch.utils.data import DataLoader


def train(model, dataset, device):
    loader = DataLoader(dataset, batch_size=8)
    model.to(device)
    for images, labels in loader:
        images.to(device)
        loss = model(images).sum()
        loss.backward()
    state = torch.load("ckpt.pt")
    return state
"""


@pytest_lsp.fixture(
    config=ClientServerConfig(server_command=[sys.executable, "-m", "torchdoctor", "server"]),
    scope="module",
)
async def client(lsp_client: LanguageClient):  # type: ignore[no-untyped-def]
    await lsp_client.initialize_session(
        types.InitializeParams(capabilities=client_capabilities("visual-studio-code"))
    )
    yield
    await lsp_client.shutdown_session()


def _uri(path: Path) -> str:
    return path.resolve().as_uri()


async def _published(client: LanguageClient, uris: list[str], check: Any = None) -> None:
    """Wait until the server has published diagnostics for every uri (and `check` holds).

    Polling, not `wait_for_notification`: a notification that arrives before the wait
    starts would be missed, and the test would hang."""

    async def arrived() -> None:
        while not all(u in client.diagnostics for u in uris) or (check and not check()):
            await asyncio.sleep(0.02)

    await asyncio.wait_for(arrived(), timeout=120)


async def _open(client: LanguageClient, path: Path, text: str) -> list[types.Diagnostic]:
    uri = _uri(path)
    client.text_document_did_open(
        types.DidOpenTextDocumentParams(types.TextDocumentItem(uri, "python", 1, text))
    )
    await _published(client, [uri])
    return client.diagnostics[uri]


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "pyproject.toml").write_text('[tool.torchdoctor]\nignore = ["TD112"]\n')
    return tmp_path


async def test_diagnostics_follow_open_change_and_the_project_config(
    client: LanguageClient, project: Path
) -> None:
    path = project / "train.py"
    diagnostics = await _open(client, path, TRAIN)
    # TD112 also fires here, but the project's config ignores it
    assert sorted((d.code, d.range.start.line, d.range.start.character) for d in diagnostics) == [
        ("TD102", 8, 8),
        ("TD402", 11, 12),
    ]
    assert all(d.source == "torchdoctor" for d in diagnostics)

    fixed = TRAIN.replace("        images.to(device)\n", "        images = images.to(device)\n")
    uri = _uri(path)
    client.text_document_did_change(
        types.DidChangeTextDocumentParams(
            types.VersionedTextDocumentIdentifier(2, uri),
            [types.TextDocumentContentChangeWholeDocument(fixed)],
        )
    )
    await _published(client, [uri], lambda: len(client.diagnostics[uri]) == 1)
    assert [d.code for d in client.diagnostics[uri]] == ["TD402"]


def _apply(text: str, edits: list[types.TextEdit]) -> str:
    lines = text.splitlines(keepends=True)
    for edit in sorted(edits, key=lambda e: (e.range.start.line, e.range.start.character))[::-1]:
        start, end = edit.range.start, edit.range.end
        before = lines[start.line][: start.character]
        after = lines[end.line][end.character :] if end.line < len(lines) else ""
        lines[start.line : end.line + 1] = [before + edit.new_text + after]
    return "".join(lines)


async def test_code_actions_fix_silence_and_fix_all(client: LanguageClient, tmp_path: Path) -> None:
    path = tmp_path / "train.py"
    diagnostics = await _open(client, path, TRAIN)
    td102 = next(d for d in diagnostics if d.code == "TD102")
    actions = await client.text_document_code_action_async(
        types.CodeActionParams(
            types.TextDocumentIdentifier(_uri(path)),
            td102.range,
            types.CodeActionContext([td102]),
        )
    )
    assert actions is not None
    by_title = {a.title: a for a in actions if isinstance(a, types.CodeAction)}
    fix = next(a for t, a in by_title.items() if t.startswith("TD102") and "noqa" not in t)
    assert fix.is_preferred
    assert fix.edit is not None and fix.edit.changes is not None
    fixed = _apply(TRAIN, fix.edit.changes[_uri(path)])
    assert "        images = images.to(device)\n" in fixed

    silence = by_title["TD102: silence on this line (# noqa: TD102)"]
    assert silence.edit is not None and silence.edit.changes is not None
    silenced = _apply(TRAIN, silence.edit.changes[_uri(path)])
    assert "        images.to(device)  # noqa: TD102\n" in silenced

    fix_all = next(
        a
        for a in actions
        if isinstance(a, types.CodeAction) and a.kind and a.kind.startswith("source.fixAll")
    )
    assert fix_all.edit is not None and fix_all.edit.changes is not None
    all_fixed = _apply(TRAIN, fix_all.edit.changes[_uri(path)])
    assert "images = images.to(device)" in all_fixed
    assert 'torch.load("ckpt.pt", map_location=' in all_fixed


async def test_hover_shows_the_rule_docs(client: LanguageClient, tmp_path: Path) -> None:
    path = tmp_path / "load.py"
    await _open(client, path, TRAIN)
    hover = await client.text_document_hover_async(
        types.HoverParams(types.TextDocumentIdentifier(_uri(path)), types.Position(11, 15))
    )
    assert hover is not None
    assert isinstance(hover.contents, types.MarkupContent)
    assert "TD402" in hover.contents.value and "map_location" in hover.contents.value
    nothing = await client.text_document_hover_async(
        types.HoverParams(types.TextDocumentIdentifier(_uri(path)), types.Position(0, 0))
    )
    assert nothing is None


async def test_notebook_cells_get_their_own_diagnostics(
    client: LanguageClient, tmp_path: Path
) -> None:
    notebook_uri = _uri(tmp_path / "train.ipynb")
    cells = ["import torch\n", 'x = torch.zeros(3)\nstate = torch.load("a.pt")\n']
    cell_uris = [f"vscode-notebook-cell:{tmp_path / 'train.ipynb'}#cell{i}" for i in range(2)]
    client.notebook_document_did_open(
        types.DidOpenNotebookDocumentParams(
            types.NotebookDocument(
                notebook_uri,
                "jupyter-notebook",
                1,
                [types.NotebookCell(types.NotebookCellKind.Code, u) for u in cell_uris],
            ),
            [
                types.TextDocumentItem(u, "python", 1, c)
                for u, c in zip(cell_uris, cells, strict=True)
            ],
        )
    )
    await _published(client, cell_uris)
    assert list(client.diagnostics[cell_uris[0]]) == []
    [td402] = client.diagnostics[cell_uris[1]]
    assert td402.code == "TD402"
    assert (td402.range.start.line, td402.range.start.character) == (1, 8)


async def test_a_saved_file_is_served_from_the_results_cache(
    client: LanguageClient, project: Path
) -> None:
    path = project / "saved.py"
    path.write_text(TRAIN)
    diagnostics = await _open(client, path, TRAIN)
    assert sorted(d.code for d in diagnostics) == ["TD102", "TD402"]
    assert any((project / ".torchdoctor_cache").iterdir())  # written by the same cache as check


async def test_a_broken_config_is_said_once_and_gives_no_diagnostics(
    client: LanguageClient, tmp_path: Path
) -> None:
    (tmp_path / "pyproject.toml").write_text('[tool.torchdoctor]\nselcet = ["TD1"]\n')
    diagnostics = await _open(client, tmp_path / "train.py", TRAIN)
    assert list(diagnostics) == []
    assert any("selcet" in m.message for m in client.messages)
