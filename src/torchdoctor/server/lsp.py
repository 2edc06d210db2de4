"""The Language Server (pygls): diagnostics, quick fixes, `# noqa` actions and rule docs on hover.

Documents are checked when opened, changed and saved — `.py` files as text
documents, notebooks through the protocol's notebook sync, as one module of
their code cells, like `torchdoctor check` reads an `.ipynb`.
"""

from __future__ import annotations

from pathlib import Path

from lsprotocol import types
from pygls.lsp.server import LanguageServer
from pygls.uris import to_fs_path
from pygls.workspace import TextDocument

from torchdoctor import __version__
from torchdoctor.catalog import lookup
from torchdoctor.check.rule import Severity
from torchdoctor.server.checking import (
    Checked,
    DocFinding,
    DocumentChecker,
    Span,
    TextEdit,
    fix_all,
)

SOURCE = "torchdoctor"
FIX_ALL_KIND = types.CodeActionKind.SourceFixAll + ".torchdoctor"
_SEVERITY = {
    Severity.ERROR: types.DiagnosticSeverity.Error,
    Severity.WARNING: types.DiagnosticSeverity.Warning,
    Severity.INFO: types.DiagnosticSeverity.Information,
}


class TorchDoctorServer(LanguageServer):
    def __init__(self) -> None:
        super().__init__(
            "torchdoctor",
            __version__,
            text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
            notebook_document_sync=types.NotebookDocumentSyncOptions(
                notebook_selector=[
                    types.NotebookDocumentFilterWithCells(
                        cells=[types.NotebookCellLanguage(language="python")],
                        notebook="*",
                    )
                ],
                save=True,
            ),
        )
        self.checker = DocumentChecker()
        self.config_errors_shown: set[str] = set()

    # -- documents ----------------------------------------------------------------
    def parts_of(self, uri: str) -> tuple[Path, list[TextDocument], bool] | None:
        """The file behind `uri` (a .py document, a notebook, or a cell of one) and its parts."""
        notebook = self.workspace.get_notebook_document(notebook_uri=uri)
        if notebook is None:
            notebook = self.workspace.get_notebook_document(cell_uri=uri)
        if notebook is not None:
            path = to_fs_path(notebook.uri)
            cells = [
                self.workspace.get_text_document(cell.document)
                for cell in notebook.cells
                if cell.kind == types.NotebookCellKind.Code
            ]
            return (Path(path), cells, True) if path else None
        path = to_fs_path(uri)
        if not path or not path.endswith((".py", ".pyi")):
            return None
        return Path(path), [self.workspace.get_text_document(uri)], False

    def check(self, uri: str) -> tuple[Checked, list[TextDocument]] | None:
        found = self.parts_of(uri)
        if found is None:
            return None
        path, docs, notebook = found
        checked = self.checker.check(path, [d.source for d in docs], notebook=notebook)
        if checked.config_error and checked.config_error not in self.config_errors_shown:
            self.config_errors_shown.add(checked.config_error)
            self.window_show_message(
                types.ShowMessageParams(types.MessageType.Error, checked.config_error)
            )
        return checked, docs

    def publish(self, uri: str) -> None:
        found = self.check(uri)
        if found is None:
            return
        checked, docs = found
        per_part: list[list[types.Diagnostic]] = [[] for _ in docs]
        for item in checked.findings:
            per_part[item.span.part].append(self.diagnostic(item, docs[item.span.part]))
        for doc, diagnostics in zip(docs, per_part, strict=True):
            self.text_document_publish_diagnostics(
                types.PublishDiagnosticsParams(doc.uri, diagnostics, doc.version)
            )

    # -- conversions --------------------------------------------------------------
    def lsp_range(self, doc: TextDocument, span: Span) -> types.Range:
        server_range = types.Range(
            types.Position(span.line, max(span.column, 0)),
            types.Position(span.end_line, max(span.end_column, 0)),
        )
        return self.workspace.position_codec.range_to_client_units(doc.lines, server_range)

    def diagnostic(self, item: DocFinding, doc: TextDocument) -> types.Diagnostic:
        finding = item.finding
        info = lookup(finding.code)
        return types.Diagnostic(
            range=self.lsp_range(doc, item.span),
            message=finding.message + (f"\n{finding.hint}" if finding.hint else ""),
            severity=_SEVERITY.get(info.severity if info else Severity.WARNING),
            code=finding.code,
            code_description=types.CodeDescription(info.url) if info else None,
            source=SOURCE,
            data={"code": finding.code, "line": finding.line, "column": finding.column},
        )

    def workspace_edit(
        self, docs: list[TextDocument], edits: list[TextEdit]
    ) -> types.WorkspaceEdit:
        changes: dict[str, list[types.TextEdit]] = {}
        for edit in edits:
            doc = docs[edit.span.part]
            changes.setdefault(doc.uri, []).append(
                types.TextEdit(self.lsp_range(doc, edit.span), edit.new_text)
            )
        return types.WorkspaceEdit(changes=changes)


server = TorchDoctorServer()


@server.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: TorchDoctorServer, params: types.DidOpenTextDocumentParams) -> None:
    ls.publish(params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: TorchDoctorServer, params: types.DidChangeTextDocumentParams) -> None:
    ls.publish(params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_SAVE)
def did_save(ls: TorchDoctorServer, params: types.DidSaveTextDocumentParams) -> None:
    ls.publish(params.text_document.uri)


@server.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: TorchDoctorServer, params: types.DidCloseTextDocumentParams) -> None:
    path = to_fs_path(params.text_document.uri)
    if path:
        ls.checker.forget(Path(path))
    ls.text_document_publish_diagnostics(
        types.PublishDiagnosticsParams(params.text_document.uri, [])
    )


@server.feature(types.NOTEBOOK_DOCUMENT_DID_OPEN)
def notebook_open(ls: TorchDoctorServer, params: types.DidOpenNotebookDocumentParams) -> None:
    ls.publish(params.notebook_document.uri)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_CHANGE)
def notebook_change(ls: TorchDoctorServer, params: types.DidChangeNotebookDocumentParams) -> None:
    ls.publish(params.notebook_document.uri)


@server.feature(types.NOTEBOOK_DOCUMENT_DID_SAVE)
def notebook_save(ls: TorchDoctorServer, params: types.DidSaveNotebookDocumentParams) -> None:
    ls.publish(params.notebook_document.uri)


def _overlaps(a: types.Range, b: types.Range) -> bool:
    start_a, end_a = (a.start.line, a.start.character), (a.end.line, a.end.character)
    start_b, end_b = (b.start.line, b.start.character), (b.end.line, b.end.character)
    return start_a <= end_b and start_b <= end_a


@server.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(
        code_action_kinds=[types.CodeActionKind.QuickFix, FIX_ALL_KIND],
        resolve_provider=False,
    ),
)
def code_actions(ls: TorchDoctorServer, params: types.CodeActionParams) -> list[types.CodeAction]:
    found = ls.check(params.text_document.uri)
    if found is None:
        return []
    checked, docs = found
    uri = params.text_document.uri
    actions: list[types.CodeAction] = []
    only = params.context.only
    if not only or any(kind.startswith(types.CodeActionKind.QuickFix) for kind in only):
        for item in checked.findings:
            doc = docs[item.span.part]
            if doc.uri != uri or not _overlaps(ls.lsp_range(doc, item.span), params.range):
                continue
            diagnostic = ls.diagnostic(item, doc)
            code = item.finding.code
            if item.fix_edits and item.finding.fix is not None:
                label = " (unsafe fix)" if item.unsafe_fix else ""
                actions.append(
                    types.CodeAction(
                        title=f"{code}: {item.finding.fix.message}{label}",
                        kind=types.CodeActionKind.QuickFix,
                        diagnostics=[diagnostic],
                        edit=ls.workspace_edit(docs, item.fix_edits),
                        is_preferred=not item.unsafe_fix,
                    )
                )
            if item.noqa_edit.new_text:
                actions.append(
                    types.CodeAction(
                        title=f"{code}: silence on this line (# noqa: {code})",
                        kind=types.CodeActionKind.QuickFix,
                        diagnostics=[diagnostic],
                        edit=ls.workspace_edit(docs, [item.noqa_edit]),
                    )
                )
    if not only or any(FIX_ALL_KIND.startswith(kind) for kind in only):
        action = _fix_all_action(ls, uri, docs)
        if action is not None:
            actions.append(action)
    return actions


def _fix_all_action(
    ls: TorchDoctorServer, uri: str, docs: list[TextDocument]
) -> types.CodeAction | None:
    found = ls.parts_of(uri)
    if found is None:
        return None
    path, _, notebook = found
    fixed = fix_all(path, [d.source for d in docs], notebook=notebook)
    if fixed is None:
        return None
    changes = {}
    for doc, text in zip(docs, fixed, strict=True):
        if text != doc.source:
            end = types.Position(len(doc.lines), 0)
            changes[doc.uri] = [types.TextEdit(types.Range(types.Position(0, 0), end), text)]
    if not changes:
        return None
    return types.CodeAction(
        title="torchdoctor: apply every safe fix",
        kind=FIX_ALL_KIND,
        edit=types.WorkspaceEdit(changes=changes),
    )


@server.feature(types.TEXT_DOCUMENT_HOVER)
def hover(ls: TorchDoctorServer, params: types.HoverParams) -> types.Hover | None:
    found = ls.check(params.text_document.uri)
    if found is None:
        return None
    checked, docs = found
    at = types.Range(params.position, params.position)
    for item in checked.findings:
        doc = docs[item.span.part]
        if doc.uri != params.text_document.uri:
            continue
        where = ls.lsp_range(doc, item.span)
        info = lookup(item.finding.code)
        if info is not None and _overlaps(where, at):
            text = f"**{info.code} {info.name}**\n\n{info.doc}\n\n[Rule page]({info.url})"
            return types.Hover(types.MarkupContent(types.MarkupKind.Markdown, text), range=where)
    return None


def serve() -> None:
    """Speak LSP on standard input and output until the editor shuts the server down."""
    server.start_io()
