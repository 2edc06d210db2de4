from __future__ import annotations

import ast
import os
from typing import ClassVar

from torchdoctor.check.analysis.cpu_saves import SAVES, keyword, save_path
from torchdoctor.check.analysis.saved_objects import (
    Save,
    SavedObjects,
    enclosing_class,
    file_keys,
    same_file,
)
from torchdoctor.check.analysis.scope_index import binding, calls_on_lines, own_nodes, scope_nodes
from torchdoctor.check.project import SavedFile
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.tree_walk import spans_a_line, walk_statements

_LOADS = frozenset({"torch.load", "torch.serialization.load"})


class WeightsOnlyLoadOfObjects(Rule):
    """`torch.load` under the `weights_only=True` default of a file holding Python objects.

    ## What it does
    Finds `torch.load(...)` without `weights_only=` of a file that this file writes with
    `torch.save` holding objects other than tensors, numbers, strings and plain
    containers: a whole module, a NumPy array (`np.*(...)`, `.numpy()`, `.to_numpy()`, a
    call of a project function whose return annotation is an array or holds one on every
    branch: `-> npt.NDArray | dict[str, npt.NDArray]`), an `argparse.Namespace` (`args` from
    `parse_args()`), an instance of a class of the project (built here, or a name
    declared as one: `box: Boxed = wrap(data, Boxed)`, `Boxed` a plain class of any
    file of the project). The save and the load are
    matched by the file expression (`torch.save(x, path)` ... `torch.load(path)`; a
    formatted name read back matches the literal names it can be: `cache / f"{split}_ds"`
    reads what `cache / "train_ds"` wrote) or by
    the keys the loaded dict is read with (`ckpt["args"]` where a saved dict has
    `"args": args`), or, in two methods of one class, by paths from the same method
    (`path = self._file(key)`). A saved `obj: T` of a generic class holds what the
    project builds that class with (`Store[Record](...)`, a class of the project).
    A load of a file name this file never writes is matched with the saves of other files
    (`ProjectIndex.saved_files_for`) by the last part of the name, through the names the
    function binds: a shared constant (`f"{prefix}{KEYS.MODEL_FILE}"` in both) anywhere in
    the project, a literal name with a stem (`f"{prefix}model.pt"`) in the same folder (a
    bare suffix, `f"{epoch}.pt"`, names no file).
    Quiet when the file registers safe globals (`add_safe_globals`, `safe_globals`),
    when the configured `target-version` is older than torch 2.6, or, with no
    `target-version`, when the project's dependency pins allow no torch 2.6 or newer
    (`torch~=2.5.0`, `torch<2.6`).

    ## Why is this bad?
    Since torch 2.6 `torch.load` defaults to `weights_only=True`, which unpickles only
    tensors and plain data. Loading such a file fails with `UnpicklingError: Weights
    only load failed ... Unsupported global: GLOBAL argparse.Namespace` (or
    `numpy.core.multiarray._reconstruct`, or the model's class): the code worked when
    written and breaks on upgrading torch. On by default: the load always fails.

    ## Example
    ```python
    torch.save({"model": model.state_dict(), "args": args}, "ckpt.pt")
    ckpt = torch.load("ckpt.pt")
    ```

    ## Use instead
    ```python
    torch.save({"model": model.state_dict(), "args": vars(args)}, "ckpt.pt")
    ckpt = torch.load("ckpt.pt")
    ```
    or, for your own trusted files, `torch.load(path, weights_only=False)`, or
    `torch.serialization.add_safe_globals([argparse.Namespace])`.

    ## Fix safety
    No fix is offered: `weights_only=False` is safe only for trusted files (TD403).

    ## References
    - https://pytorch.org/docs/stable/notes/serialization.html#weights-only
    - https://pytorch.org/docs/stable/generated/torch.load.html
    """

    code = "TD406"
    name = "weights-only-load-of-objects"
    category = "checkpoint"
    severity = Severity.ERROR
    triggers: ClassVar[tuple[str, ...]] = ("save", "load")

    def finish(self) -> None:
        if not self.ctx.torch_may_be_at_least(2, 6):
            return  # older torch loads with weights_only=False
        source = self.ctx.source
        # every (scope, file expression) `torch.save` writes to, with the line
        self.written: list[tuple[ast.AST, str, int, ast.expr]] = []
        if "safe_globals" in source or "load(" not in source:
            return  # a safe-globals registry, or nothing loaded
        if "save(" not in source:  # only other files' saves to match: find the loads alone
            if self.ctx.project.saving_files:
                for scope, call in calls_on_lines(
                    self.ctx, self.ctx.lines_holding(["load"]), spanning=True
                ):
                    if self.ctx.call_name_in(call, _LOADS) and _default_load(call):
                        self._match_project(call, scope)
            return
        self.reader = SavedObjects(self.ctx)
        saves: list[Save] = []
        loads: list[tuple[ast.Call, ast.AST]] = []
        # a function none of whose lines names a save or load as a whole word (or an
        # import's alias of one) calls neither: its nodes are not visited
        lines = self.ctx.lines_naming(self.ctx.call_needles(SAVES | _LOADS))
        for scope in walk_statements(self.ctx.tree):
            if not isinstance(scope, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            if scope is not self.ctx.tree and not spans_a_line(scope, lines):  # type: ignore[arg-type]
                continue
            for node in scope_nodes(self.ctx, scope):
                if not isinstance(node, ast.Call):
                    continue
                name = self.ctx.qualname(node.func) or ""
                if name in SAVES:
                    path = save_path(node)
                    if path is not None:
                        self.written.append((scope, self.ctx.segment(path), node.lineno, path))
                    save = self.reader.save(node, scope)
                    if save is not None:
                        saves.append(save)
                elif name in _LOADS and _default_load(node):
                    loads.append((node, scope))
        for load, scope in loads:
            if not self._match(load, scope, saves):
                self._match_project(load, scope)

    # -- loads ------------------------------------------------------------
    def _match(self, load: ast.Call, scope: ast.AST, saves: list[Save]) -> bool:
        """Match the load with the file's own saves: whether they decide (a report, or
        the file writes plain data there)."""
        source = load.args[0] if load.args else keyword(load, "f")
        if source is None:
            return True
        text = self.ctx.segment(source)
        # The same file expression saved in the same function: the latest save before
        # the load tells what the file holds (`b = io.BytesIO()` in two tests is two files).
        here = [w for w in self.written if w[0] is scope and w[1] == text]
        if here:
            before = [w for w in here if w[2] < load.lineno] or here
            line = max(w[2] for w in before)
            save = next((s for s in saves if s.call.lineno == line and s.scope is scope), None)
            if save is not None:
                self._report(load, save.call.lineno, save.whole or "", f"to `{text}`")
            return True
        # A local name of another function is another file (`path` parameters, `b`
        # buffers); those loads are matched by the keys they read only.
        local = isinstance(source, ast.Name) and scope is not self.ctx.tree
        maker = self._path_method(source, scope, load.lineno) if local else None
        for save in saves if maker else ():
            if self._path_method(
                save.path_node, save.scope, save.call.lineno
            ) == maker and enclosing_class(self.ctx.tree, save.scope) is enclosing_class(
                self.ctx.tree, scope
            ):
                how = f"to a path from `self.{maker}(...)`"
                self._report(load, save.call.lineno, save.whole or "", how)
                return True
        for save in saves:
            if not local and same_file(save.path_node, source):
                self._report(load, save.call.lineno, save.whole or "", f"to `{save.path}`")
                return True
        if any(same_file(w[3], source) for w in self.written) and not local:
            return True  # written here with plain data only
        read = self._keys_read(load, scope)
        for save in saves:
            if _literal(save.path) and _literal(text):
                continue  # two different named files
            for key in read:
                if key in save.keys:
                    how = f"with the key `{key!r}`"
                    self._report(load, save.call.lineno, save.keys[key], how)
                    return True
        return False

    def _match_project(self, load: ast.Call, scope: ast.AST) -> None:
        """Match the load with the saves of other files that write the file name it
        reads: a shared constant (`f"{prefix}{KEYS.MODEL}"`) anywhere in the project, a
        literal name (`f"{prefix}model.pt"`) in the same folder."""
        source = load.args[0] if load.args else keyword(load, "f")
        if source is None or not self.ctx.project.saving_files:
            return
        keys = file_keys(self.ctx, scope, source, load.lineno)
        if not keys or any(
            keys & file_keys(self.ctx, where, path, line) for where, _, line, path in self.written
        ):
            return  # no name to match, or this file writes that name itself
        folder = os.path.dirname(os.path.abspath(self.ctx.path))
        for fact in sorted(self.ctx.project.saved_files_for(keys), key=_order):
            if not fact.what or os.path.abspath(fact.path) == os.path.abspath(self.ctx.path):
                continue
            if fact.key.startswith("lit:") and os.path.dirname(os.path.abspath(fact.path)) != (
                folder
            ):
                continue  # the same name in another folder: another program's file
            how = f"to the same name (`{fact.key.split(':', 1)[1]}`)"
            self._report(load, f"{os.path.basename(fact.path)} line {fact.line}", fact.what, how)
            return

    def _path_method(self, path: ast.expr, scope: ast.AST, line: int) -> str | None:
        """`_get_path` for a local name bound to `self._get_path(...)`: two methods of a
        class that take their file paths from the same method of it use one store."""
        if not isinstance(path, ast.Name) or scope is self.ctx.tree:
            return None
        bound = binding(self.ctx, scope, path.id, line)
        if (
            isinstance(bound, ast.Call)
            and isinstance(bound.func, ast.Attribute)
            and isinstance(bound.func.value, ast.Name)
            and bound.func.value.id == "self"
        ):
            return bound.func.attr
        return None

    def _keys_read(self, load: ast.Call, scope: ast.AST) -> list[str]:
        """The string keys the loaded value is read with (`state["args"]`)."""
        target = None
        for node in own_nodes(self.ctx, scope):
            if isinstance(node, ast.Assign) and node.value is load and len(node.targets) == 1:
                target = node.targets[0]
        if not isinstance(target, ast.Name):
            return []
        return [
            node.slice.value
            for node in own_nodes(self.ctx, scope)
            if isinstance(node, ast.Subscript)
            and isinstance(node.value, ast.Name)
            and node.value.id == target.id
            and isinstance(node.slice, ast.Constant)
            and isinstance(node.slice.value, str)
        ]

    def _report(self, load: ast.Call, where: int | str, what: str, how: str) -> None:
        at = f"line {where}" if isinstance(where, int) else where
        self.report(
            load,
            f"`{self.ctx.segment(load)[:60]}` loads with the `weights_only=True` default "
            f"(torch >= 2.6) a file that `torch.save` at {at} writes "
            f"{how}, holding {what}: UnpicklingError: Weights only load failed",
            hint="save plain data (`state_dict()`, `vars(args)`, tensors), or load your own "
            "trusted file with `weights_only=False` / `add_safe_globals([...])`",
        )


def _default_load(call: ast.Call) -> bool:
    """A load that leaves `weights_only` (and the unpickler) at the default."""
    return not any(k.arg in ("weights_only", "pickle_module") for k in call.keywords)


def _order(fact: SavedFile) -> tuple[str, int]:
    return (fact.path, fact.line)


def _literal(text: str) -> bool:
    """A file named by a plain string literal (`"ckpt.pt"`)."""
    return text[:1] in "'\"" and text[-1:] == text[:1]
