from __future__ import annotations

import ast
import os
import re
from typing import ClassVar

from torchdoctor.check.analysis.before_load import (
    TEMP,
    TEMP_PARAMETERS,
    TORCH_LOADS,
    from_temp_folder,
    has_cpu_fallback,
    load_source,
    maps_location,
    written_by_earlier_call,
)
from torchdoctor.check.analysis.cpu_saves import (
    bound_once,
    file_names,
    file_saves,
    loads_cpu_saved_state,
    opened_path,
    saved_on_cpu,
)
from torchdoctor.check.analysis.gpu_gates import runs_only_with_gpu
from torchdoctor.check.analysis.names import is_test_file
from torchdoctor.check.analysis.published_weights import published_by_pytorch
from torchdoctor.check.analysis.saved_objects import file_keys, same_file
from torchdoctor.check.analysis.scope_index import calls_on_lines
from torchdoctor.check.analysis.wraps import bound_arguments, parameter_slots
from torchdoctor.check.context import FileContext
from torchdoctor.check.rule import FixAvailability, Rule, Severity
from torchdoctor.check.rules._file_gate import has_word, skip_visits
from torchdoctor.check.tree_walk import walk, walk_statements

_URL_LOADS = ("load_state_dict_from_url", "load_url")
# Saves that put every tensor on the CPU first (FSDP's state-dict configs).
_CPU_SAVES = re.compile(r"offload_to_cpu\s*=\s*True")
# Checkpoint handlers given the folder they write into (ignite, Lightning).
_FOLDER_WRITERS = frozenset({"ModelCheckpoint", "DiskSaver"})


class LoadWithoutMapLocation(Rule):
    """`torch.load()` without `map_location`: fails on a machine without the saving GPU.

    ## What it does
    Finds calls to `torch.load` that do not pass `map_location`, and of the hub's
    download helpers that hand theirs to `torch.load` (`torch.hub.load_state_dict_from_url`,
    `torch.utils.model_zoo.load_url`, torchvision's re-export).

    Loads that cannot hit the problem are left alone: a round trip that
    `torch.save`s to the same file or buffer earlier in the same function (the
    saving device is this machine's), a cache (the load runs under
    `if os.path.exists(path):` and the other branch computes the value and saves it to
    `path`), and loads from in-memory `io.BytesIO`
    buffers, which hold bytes the program produced itself (pickling, RPC, archive
    members) and whose devices it means to restore. In a notebook, which runs its cells
    top to bottom in one session, so is a file an earlier cell wrote (`torch.save`,
    `trainer.save_checkpoint`, or into the folder of a `ModelCheckpoint`/`DiskSaver`).
    So are PyTorch's own published weights (a `https://download.pytorch.org/` URL,
    directly, through a name bound only to such URLs, or as an item of a dict of them:
    `load_url(model_urls[arch])`), which are saved from the CPU and which torchvision
    itself loads without `map_location`.
    So are loads of what holds no GPU tensors, as the file shows: NumPy arrays (the
    result goes to `torch.from_numpy`), a `GradScaler`'s state (floats and ints), and
    files the project itself writes from the CPU. A save writes CPU tensors when its
    value is brought there (`x.cpu()`, `model.cpu().state_dict()`, a name bound to
    such a value, a model whose last move before the save is `model.eval().cpu()`;
    FSDP's `offload_to_cpu=True`), or when the saving file never names
    an accelerator (no `cuda`, `device`, `.to(`...: a CPU-only lesson, a dataset
    caching what it read) and the value is made there, not handed in (`self`'s state
    or a parameter may be on a GPU code elsewhere moved it to). The saves are matched
    with the load by the file: the same file expression (`with open(path, "wb") as f:
    torch.save(x, f)` writes `path`), the same literal file name, the same shared
    constant (`os.path.join(out, FILES.STATE)`); first in this file, and if this
    file writes no such file, in every file of the project (`train.py` saves
    `"model.pt"`, `predict.py` loads it). Every save matched must be on the CPU. A
    path parameter counts when every call of its function in the file passes such a
    file (`load_checkpoint("checkpoint.pth")`). A state dict loaded into a `Net()`
    (`net.load_state_dict(state)`) counts when this file saves `state_dict()`s of
    `Net`s, and all of them from the CPU: its checkpoints of that model. And
    loads in tests that never run without a GPU: under `@require_torch_gpu`,
    `@require_torch_accelerator`, `@unittest.skipIf(not torch.cuda.is_available(),
    ...)` and the like, on the test or its class; and loads that run only where
    `torch.cuda.is_available()` held (in its `if`, the `else` of `if not ...`, after
    `if not torch.cuda.is_available(): return` or an `assert` of it). Hard-wired
    CUDA before a load (`model.cuda()`) does not make it safe: on a machine with
    fewer GPUs, or in each process of a multi-GPU run, the tensors still go back to
    the GPU that saved them.

    And loads the code already guards or feeds itself: in a `try:` whose `except`
    (catching the `RuntimeError`) loads the same file with `map_location`; in the
    GPU branch of a test naming the device (`if use_cuda:`, `if args.device ==
    "cuda":`; not a parameter the caller may leave at its default) whose other branch
    loads it with `map_location`; of a file written just before, on every path, by a
    function of the project that `torch.save`s to the parameter the call binds to that
    file, or leaves at a default naming it (`train(model, data, save_path="best.pt")`
    then `torch.load("best.pt")`); and in a test file, a helper's parameter that every
    call passes a path in the calling test's temporary folder
    (`check(os.path.join(tmp_path, "ep1.pt"))`).

    ## Why is this bad?
    `torch.save` records the device of every tensor. Without `map_location`,
    `torch.load` puts each tensor back on that device, so a checkpoint written on
    a GPU machine fails on a CPU-only laptop or CI runner with
    `RuntimeError: Attempting to deserialize object on a CUDA device but
    torch.cuda.is_available() is False`, and one written on `cuda:1` fails on a
    one-GPU machine with `invalid device ordinal`. Even where it works, every
    tensor first lands on the saving GPU, which can run that GPU out of memory.

    ## Example
    ```python
    state = torch.load("model.pt")
    model.load_state_dict(state)
    ```

    ## Use instead
    ```python
    state = torch.load("model.pt", map_location="cpu")
    model.load_state_dict(state)  # load_state_dict copies onto the model's device
    ```
    or `td.load_checkpoint("model.pt", model)`, which always sets it.

    ## Fix safety
    The fix adds `map_location="cpu"` and is safe: `load_state_dict` copies the
    values onto the model's own device. Code that relies on tensors coming back
    on the GPU directly should pass `map_location=device` instead.

    ## References
    - https://pytorch.org/docs/stable/generated/torch.load.html
    """

    code = "TD402"
    name = "load-without-map-location"
    category = "checkpoint"
    severity = Severity.WARNING
    fix_availability = FixAvailability.SAFE
    triggers: ClassVar[tuple[str, ...]] = ("load",)
    node_types: ClassVar[tuple[type[ast.AST], ...]] = (ast.Call,)

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        if not any(has_word(ctx.source, w) for w in ("load", *_URL_LOADS)):
            skip_visits(self)  # `x.load(` or an import of torch's `load` names the word

    def visit_words(self) -> tuple[str, ...]:
        # `call_name_in` accepts a callee whose last name or import alias is the word
        return self.ctx.call_needles(TORCH_LOADS)

    def visit(self, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        name = self.ctx.call_name_in(node, TORCH_LOADS)
        if name is None or maps_location(self.ctx, node):
            return  # map_location given (by position too), or **kwargs that may carry it
        source = load_source(node)
        if source is None:
            return
        if (
            self._in_memory(source)
            or self._saved_here(source)
            or self._caches(node, source)
            or self._holds_no_device_tensors(node)
            or self._written_on_cpu(source, node.lineno)
            or self._test_reads_its_temp_files()
            or runs_only_with_gpu(self.ctx, node)
            or self._every_caller_passes_such(source)
            or self._state_saved_on_cpu(node)
            or has_cpu_fallback(self.ctx, node, source)
            or written_by_earlier_call(self.ctx, node, source)
            or published_by_pytorch(source, self._scope(), self.ctx.tree)
        ):
            return
        last = max(
            (*node.args, *node.keywords),
            key=lambda n: (getattr(n, "end_lineno", 0), getattr(n, "end_col_offset", 0)),
        )
        fix = self.ctx.fix(
            'add `map_location="cpu"`',
            self.ctx.insert_after(last, ', map_location="cpu"'),
        )
        last_name = name.rsplit(".", 1)[-1]
        self.report(
            node,
            f"`{'torch.load' if name == 'torch.load' else last_name}` without `map_location` "
            "restores tensors onto the device they were saved from; it fails on a machine "
            "without that GPU",
            fix=fix,
        )

    def _holds_no_device_tensors(self, load: ast.Call) -> bool:
        """What is loaded holds no GPU tensors: NumPy arrays (`torch.from_numpy(x)` of
        the loaded name) or a GradScaler's state (floats and ints)."""
        parent = self.ctx.stack[-1] if self.ctx.stack else None
        if isinstance(parent, ast.Call) and (
            (
                isinstance(parent.func, ast.Attribute)
                and parent.func.attr == "load_state_dict"
                and "scaler" in self.ctx.segment(parent.func.value).lower()
            )
            or (self.ctx.call_name(parent) or "").endswith("from_numpy")
        ):
            return True  # a scaler's state, or `torch.from_numpy(torch.load(path))`
        if not (isinstance(parent, ast.Assign) and len(parent.targets) == 1):
            return False
        target = parent.targets[0]
        if not isinstance(target, ast.Name):
            return False
        name = re.escape(target.id)
        scope = self._scope()
        text = self.ctx.source if isinstance(scope, ast.Module) else self.ctx.segment(scope)
        return re.search(rf"from_numpy\(\s*{name}\b", text) is not None

    def _saved_from_cpu(self, source: ast.expr) -> bool:
        """This file saves the tensors it reads back on the CPU: with FSDP's
        `offload_to_cpu=True`, or a save to the same path (the same expression, or a
        file name the path holds) that `cpu_saves.saved_on_cpu` shows."""
        if _CPU_SAVES.search(self.ctx.source):
            return True
        # `load_path = os.path.join(d, f"out-{tag}.pt")`: the path a name is bound to once
        source = bound_once(self._scope(), source)
        names = file_names(source) or {self._text(source)}
        return any(
            names & (file_names(written) or {self._text(written)})
            and saved_on_cpu(self.ctx, scope, call)
            for scope, call, written in file_saves(self.ctx)
        )

    def _text(self, path: ast.expr) -> str:
        """A path expression's text however it is laid out (line breaks, a trailing comma)."""
        return ast.unparse(path)

    def _written_on_cpu(self, source: ast.expr, line: int) -> bool:
        """What the file `source` names (read at `line`) holds was written on this
        machine or from the CPU, as the saves of this file or of the project show."""
        return (
            self._saved_from_cpu(source)
            or self._every_save_on_cpu(source, line)
            or self._notebook_wrote_it(line, source)
        )

    def _every_save_on_cpu(self, source: ast.expr, line: int) -> bool:
        """Every save of this file to the file `source` names (the same file expression,
        through `with open(path, "wb") as f`, or the same file key: a shared constant, a
        literal file name), or if this file writes none, every save of the project to it
        (`ProjectIndex.saved_files_for`), writes CPU tensors only
        (`cpu_saves.saved_on_cpu`): the project writes that file, and from the CPU."""
        ctx = self.ctx
        scope = self._scope()
        path = opened_path(ctx, scope, source)
        keys = file_keys(ctx, scope, path, line)
        # a bare local name of another function is another file (`path` parameters)
        local = isinstance(path, ast.Name) and scope is not ctx.tree
        matched = [
            (where, call)
            for where, call, written in file_saves(ctx)
            if (same_file(written, path) and (where is scope or not local))
            or (keys and keys & file_keys(ctx, where, written, call.lineno))
        ]
        if matched:
            return all(saved_on_cpu(ctx, where, call) for where, call in matched)
        here = os.path.abspath(ctx.path)
        facts = [f for f in ctx.project.saved_files_for(keys) if os.path.abspath(f.path) != here]
        return bool(facts) and all(f.cpu for f in facts)

    def _state_saved_on_cpu(self, load: ast.Call) -> bool:
        parent = self.ctx.stack[-1] if self.ctx.stack else None
        return parent is not None and loads_cpu_saved_state(self.ctx, self._scope(), load, parent)

    def _caches(self, load: ast.Call, source: ast.expr) -> bool:
        """A cache: the load runs where the file exists (`if os.path.exists(path):`), and
        the other branch computes the value and `torch.save`s it to that very file. What
        it reads, this program wrote on this machine."""
        inner: ast.AST = load
        for parent in reversed(self.ctx.stack):
            if isinstance(parent, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                return False
            if (
                isinstance(parent, ast.If)
                and any(inner is s for s in parent.body)
                and _tests_existence(parent.test, source)
            ):
                return any(
                    isinstance(sub, ast.Call)
                    and len(sub.args) >= 2
                    and self.ctx.call_name(sub) == "torch.save"
                    and same_file(sub.args[1], source)
                    for statement in parent.orelse
                    for sub in walk(statement)
                )
            inner = parent
        return False

    def _every_caller_passes_such(self, source: ast.expr) -> bool:
        """A parameter of a function of this file whose every call in the file passes a
        file written on this machine or from the CPU (`load_checkpoint("ckpt.pth")` of a
        notebook whose earlier cell saved `ckpt.pth`), or, in a test file, a path in the
        calling test's temporary folder (`check(os.path.join(tmp_path, "ep1.pt"))`)."""
        function = self.ctx.enclosing_function()
        if (
            not isinstance(source, ast.Name)
            or function is None
            or not any(function is s for s in self.ctx.tree.body)
        ):
            return False
        params = parameter_slots(function, method=False)
        if source.id not in params:
            return False
        test = is_test_file(self.ctx.path)
        passed: list[ast.expr] = []
        temporary = 0
        for scope, call in calls_on_lines(self.ctx, self.ctx.lines_naming([function.name])):
            if isinstance(call.func, ast.Name) and call.func.id == function.name:
                found = dict(bound_arguments(call, params)).get(source.id)
                if test and found is not None and from_temp_folder(self.ctx, scope, found):
                    temporary += 1
                    continue  # this run writes it, on this machine
                if not isinstance(found, ast.Constant):
                    return False  # a path made elsewhere, or not passed
                passed.append(found)
        return bool(passed or temporary) and all(self._written_on_cpu(p, p.lineno) for p in passed)

    def _test_reads_its_temp_files(self) -> bool:
        """A test that works in a temporary folder (its own, or a fixture's of this file
        that makes one): what it loads was written by this run, on this machine."""
        function = self.ctx.enclosing_function()
        if function is None or not is_test_file(self.ctx.path):
            return False
        params = {a.arg for a in (*function.args.posonlyargs, *function.args.args)}
        if params & TEMP_PARAMETERS or TEMP.search(self.ctx.segment(function)):
            return True
        return any(
            isinstance(sub, ast.FunctionDef)
            and sub.name in params
            and TEMP.search(self.ctx.segment(sub)) is not None
            for sub in self.ctx.tree.body
        )

    def _notebook_wrote_it(self, line: int, source: ast.expr) -> bool:
        """A notebook runs its cells top to bottom in one session: a file that an earlier
        cell writes (`torch.save`, `trainer.save_checkpoint`, or a checkpoint handler's
        folder) is read back on the machine that wrote it."""
        if not self.ctx.path.endswith(".ipynb"):
            return False
        names, strings = self._path_parts(source, line)
        files = {s.rsplit("/", 1)[-1] for s in strings if "." in s.rsplit("/", 1)[-1]}
        for sub in walk(self.ctx.tree):
            if not isinstance(sub, ast.Call) or sub.lineno >= line:
                continue
            written, folder = self._written_path(sub)
            if written is None:
                continue
            w_names, w_strings = self._path_parts(written, sub.lineno)
            w_files = {s.rsplit("/", 1)[-1] for s in w_strings if "." in s.rsplit("/", 1)[-1]}
            if not folder and files and w_files:
                if files & w_files:
                    return True
                continue  # another file of the same folder
            if names & w_names or any(
                s == d or s.startswith(d + "/") for s in strings for d in w_strings
            ):
                return True
        return False

    def _written_path(self, call: ast.Call) -> tuple[ast.expr | None, bool]:
        """The path a call writes to, and whether it is a folder (of a handler)."""
        func = call.func
        last = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        keywords = {kw.arg: kw.value for kw in call.keywords}
        if last in _FOLDER_WRITERS:
            folder = keywords.get("dirname") or keywords.get("dirpath")
            return folder or (call.args[0] if call.args else None), True
        if last == "save_checkpoint" and isinstance(func, ast.Attribute):
            return (call.args[0] if call.args else keywords.get("filepath")), False
        if self.ctx.call_name(call) == "torch.save":
            return (call.args[1] if len(call.args) >= 2 else keywords.get("f")), False
        if isinstance(func, ast.Name):
            return self._passed_save_path(call, func.id), False
        return None, False

    def _passed_save_path(self, call: ast.Call, name: str) -> ast.expr | None:
        """The argument `call` gives the parameter a function of this file `torch.save`s
        to (`train(..., "model.pt")` of `def train(..., save_path)`), or None."""
        function = next(
            (
                s
                for s in self.ctx.tree.body
                if isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef) and s.name == name
            ),
            None,
        )
        if function is None:
            return None
        params = parameter_slots(function, method=False)
        for sub in walk(function):
            if (
                isinstance(sub, ast.Call)
                and len(sub.args) >= 2
                and isinstance(sub.args[1], ast.Name)
                and sub.args[1].id in params
                and self.ctx.call_name(sub) == "torch.save"
            ):
                found = dict(bound_arguments(call, params)).get(sub.args[1].id)
                if found is not None:
                    return found
        return None

    def _path_parts(self, path: ast.expr, before: int) -> tuple[set[str], set[str]]:
        """The variables and strings a path is built from (`log_path + "/model.pt"`),
        with the strings of module-level variables assigned before line `before`."""
        names: set[str] = set()
        strings: set[str] = set()
        callees = {id(n.func) for n in walk(path) if isinstance(n, ast.Call)}
        bases = {id(n.value) for n in walk(path) if isinstance(n, ast.Attribute)}
        for n in walk(path):
            if isinstance(n, ast.Name) and id(n) not in callees and id(n) not in bases:
                names.add(n.id)
            elif isinstance(n, ast.Constant) and isinstance(n.value, str):
                strings.add(n.value)
        for statement in self.ctx.tree.body:
            if (
                isinstance(statement, ast.Assign)
                and statement.lineno < before
                and any(isinstance(t, ast.Name) and t.id in names for t in statement.targets)
            ):
                strings |= {
                    n.value
                    for n in walk(statement.value)
                    if isinstance(n, ast.Constant) and isinstance(n.value, str)
                }
        strings = {s.removeprefix("./").rstrip("/") for s in strings}
        return names, {s for s in strings if s and s != "."}

    def _scope(self) -> ast.AST:
        function = self.ctx.enclosing_function()
        return function if function is not None else self.ctx.tree

    def _in_memory(self, source: ast.expr) -> bool:
        """`torch.load(io.BytesIO(data))`, or a name bound to one in this function (or a
        parameter annotated `BytesIO`): bytes this program holds in memory (pickling,
        RPC, archives), whose devices it means to restore."""
        if isinstance(source, ast.Call):
            return _is_bytes_io(self.ctx.qualname(source.func))
        if not isinstance(source, ast.Name):
            return False
        scope = self._scope()
        if isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
            for arg in (*scope.args.posonlyargs, *scope.args.args, *scope.args.kwonlyargs):
                if (
                    arg.arg == source.id
                    and arg.annotation is not None
                    and "BytesIO" in self.ctx.segment(arg.annotation)
                ):
                    return True
        for sub in walk_statements(scope):
            if (
                isinstance(sub, ast.Assign)
                and isinstance(sub.value, ast.Call)
                and _is_bytes_io(self.ctx.qualname(sub.value.func))
                and any(isinstance(t, ast.Name) and t.id == source.id for t in sub.targets)
            ):
                return True
        return False

    def _saved_here(self, source: ast.expr) -> bool:
        """The same function first `torch.save`s to this very file or buffer: a round
        trip on one machine, where the saving device exists."""
        scope = self._scope()
        target = self.ctx.segment(source)
        for sub in walk(scope):
            if (
                isinstance(sub, ast.Call)
                and len(sub.args) >= 2
                and sub.lineno < source.lineno  # type: ignore[attr-defined]
                and self.ctx.call_name(sub) == "torch.save"
                and self.ctx.segment(sub.args[1]) == target
            ):
                return True
        return False


def _tests_existence(test: ast.expr, path: ast.expr) -> bool:
    """`os.path.exists(path)`, `os.path.isfile(path)`, `Path(path).exists()`,
    `path.is_file()`: the test holds where the file `path` is there."""
    if not isinstance(test, ast.Call) or not isinstance(test.func, ast.Attribute):
        return False
    if test.func.attr not in ("exists", "isfile", "is_file"):
        return False
    if test.args:
        return same_file(test.args[0], path)
    owner = test.func.value
    if isinstance(owner, ast.Call) and len(owner.args) == 1:
        owner = owner.args[0]  # `Path(path).exists()`
    return same_file(owner, path)


def _is_bytes_io(name: str | None) -> bool:
    return name in ("io.BytesIO", "BytesIO")
