"""What the interpreters ask of the file they run in, as protocols.

The scope interpreter (`scope*.py`) and the mode interpreter (`mode*.py`) are built by
the per-file objects (`file_flow.FileFlow`, `file_loops.FileLoops`) and ask them
back for facts about other functions. They see those objects only through these
protocols, so that no module imports one above it.
"""

from __future__ import annotations

import ast
from typing import Protocol

from torchdoctor.check.analysis.values import AnyFunction, CallFacts, Env, Value
from torchdoctor.check.context import FileContext
from torchdoctor.check.project import ProjectIndex


class FileFacts(Protocol):
    """What a `ScopeFlow` asks of its file (implemented by `FileFlow`)."""

    ctx: FileContext
    project: ProjectIndex
    classes: dict[str, ast.ClassDef]
    toplevel_functions: dict[str, AnyFunction]

    def class_of(self, func: AnyFunction) -> ast.ClassDef | None: ...
    def methods(self, cls: ast.ClassDef) -> dict[str, AnyFunction]: ...
    def module_attrs(self, cls: ast.ClassDef) -> frozenset[str]: ...
    def is_module_class_name(self, qual: str) -> bool: ...
    def is_module_class(self, cls: ast.ClassDef) -> bool: ...
    def module_assigns(self, name: str) -> bool: ...
    def module_exit_env(self) -> Env: ...
    def returned_tensor(self, func: AnyFunction) -> Value: ...
    def self_attrs_assigned(self, func: AnyFunction) -> frozenset[str]: ...
    def init_helpers(self, cls: ast.ClassDef) -> frozenset[str]: ...
    def reached_methods(self, cls: ast.ClassDef, start: AnyFunction) -> list[AnyFunction]: ...
    def call_facts(
        self, func: AnyFunction, arguments: Env, depth: int, attributes: Env | None = None
    ) -> CallFacts | None: ...


class FileWords(Protocol):
    """What a `FunctionInfo` asks of its file (implemented by `FileLoops`)."""

    ctx: FileContext

    def words(self) -> frozenset[str]: ...
    def evaluation_words(self) -> list[str]: ...
    def model_words(self) -> list[str]: ...
