from __future__ import annotations

import ast
import re
from typing import ClassVar

from torchdoctor.check.analysis.gpu_gates import runs_only_with_gpu
from torchdoctor.check.analysis.names import is_test_file
from torchdoctor.check.analysis.wraps import bound_arguments, parameter_slots
from torchdoctor.check.context import FileContext
from torchdoctor.check.rule import FixAvailability, Rule, Severity
from torchdoctor.check.rules._file_gate import has_word, skip_visits
from torchdoctor.check.tree_walk import walk, walk_statements

# Loaders that unpickle with `torch.load`, and the position of their `map_location`
# parameter: the hub's download helpers pass theirs straight to `torch.load`.
_MAP_LOCATION_AT = {
    "torch.load": 1,
    "torch.hub.load_state_dict_from_url": 2,
    "torch.utils.model_zoo.load_url": 2,
    "torchvision.models.utils.load_state_dict_from_url": 2,
    "torchvision._internally_replaced_utils.load_state_dict_from_url": 2,
}
_TORCH_LOAD = frozenset(_MAP_LOCATION_AT)
_URL_LOADS = ("load_state_dict_from_url", "load_url")
# Words of a file that may run on, or write from, an accelerator. A file with none of
# them never touches a GPU: what it saves holds CPU tensors.
_ACCELERATOR = re.compile(r"cuda|device|gpu|accel|\bmps\b|xla|\.to\(", re.IGNORECASE)
# A temporary folder: fresh for each run, so what a test reads from it this run wrote.
_TEMP = re.compile(r"\b(tmp_path\w*|tmpdir\w*|tempfile|TemporaryDirectory|mkdtemp|mktemp)\b")
_TEMP_PARAMETERS = frozenset({"tmp_path", "tmpdir", "tmp_dir", "dirname", "temp_dir"})
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
    saving device is this machine's), and loads from in-memory `io.BytesIO`
    buffers, which hold bytes the program produced itself (pickling, RPC, archive
    members) and whose devices it means to restore. In a notebook, which runs its cells
    top to bottom in one session, so is a file an earlier cell wrote (`torch.save`,
    `trainer.save_checkpoint`, or into the folder of a `ModelCheckpoint`/`DiskSaver`).
    So are loads of what holds no GPU tensors, as the file shows: files this file
    saves on the CPU (FSDP's
    `offload_to_cpu=True`, `torch.save(x.cpu(), path)` to the same file name, any
    save to it in a file that never names an accelerator), NumPy arrays (the result
    goes to `torch.from_numpy`) and a `GradScaler`'s state (floats and ints). And
    loads in tests that never run without a GPU: under `@require_torch_gpu`,
    `@require_torch_accelerator`, `@unittest.skipIf(not torch.cuda.is_available(),
    ...)` and the like, on the test or its class; and loads that run only where
    `torch.cuda.is_available()` held (in its `if`, the `else` of `if not ...`, after
    `if not torch.cuda.is_available(): return` or an `assert` of it).

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
        return self.ctx.call_needles(_TORCH_LOAD)

    def visit(self, node: ast.AST) -> None:
        assert isinstance(node, ast.Call)
        name = self.ctx.call_name_in(node, _TORCH_LOAD)
        if name is None:
            return
        if len(node.args) > _MAP_LOCATION_AT[name] or any(
            kw.arg in ("map_location", None) for kw in node.keywords
        ):
            return  # positional map_location, or **kwargs that may carry it
        source = node.args[0] if node.args else _keyword(node, "f", "url")
        if source is None:
            return
        if (
            self._in_memory(source)
            or self._saved_here(source)
            or self._holds_no_device_tensors(node)
            or self._saved_from_cpu(source)
            or self._test_reads_its_temp_files()
            or self._notebook_wrote_it(node, source)
            or runs_only_with_gpu(self.ctx, node)
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
        if (
            isinstance(parent, ast.Call)
            and isinstance(parent.func, ast.Attribute)
            and parent.func.attr == "load_state_dict"
            and "scaler" in self.ctx.segment(parent.func.value).lower()
        ):
            return True
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
        `offload_to_cpu=True`, or `torch.save(x.cpu(), path)` to the same path (the
        same expression, or the same file name), or any save to it, of what this file
        makes, in a file that never names an accelerator (a CPU-only lesson, a dataset
        caching what it read). A module's own state (`self.state_dict()`) or an object
        handed in (a parameter) may be on a GPU that code elsewhere moved it to."""
        if _CPU_SAVES.search(self.ctx.source):
            return True
        cpu_only = _ACCELERATOR.search(self.ctx.source) is None
        names = _file_names(source) or {self.ctx.segment(source)}
        outside = self._handed_in_saves() if cpu_only else set()
        for sub in walk(self.ctx.tree):
            if (
                isinstance(sub, ast.Call)
                and len(sub.args) >= 2
                and self.ctx.call_name(sub) == "torch.save"
                and (
                    (cpu_only and id(sub) not in outside)
                    or ".cpu()" in self.ctx.segment(sub.args[0])
                )
                and names & (_file_names(sub.args[1]) or {self.ctx.segment(sub.args[1])})
            ):
                return True
        return False

    def _handed_in_saves(self) -> set[int]:
        """`torch.save` calls whose saved value is rooted at `self` or at a parameter of
        the function that saves: state this file does not make."""
        found: set[int] = set()
        for function in walk_statements(self.ctx.tree):
            if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            params = {a.arg for a in (*function.args.posonlyargs, *function.args.args)}
            params |= {a.arg for a in function.args.kwonlyargs}
            for sub in walk(function):
                if (
                    isinstance(sub, ast.Call)
                    and sub.args
                    and self.ctx.call_name(sub) == "torch.save"
                    and _root_name(sub.args[0]) in params | {"self"}
                ):
                    found.add(id(sub))
        return found

    def _test_reads_its_temp_files(self) -> bool:
        """A test that works in a temporary folder (its own, or a fixture's of this file
        that makes one): what it loads was written by this run, on this machine."""
        function = self.ctx.enclosing_function()
        if function is None or not is_test_file(self.ctx.path):
            return False
        params = {a.arg for a in (*function.args.posonlyargs, *function.args.args)}
        if params & _TEMP_PARAMETERS or _TEMP.search(self.ctx.segment(function)):
            return True
        return any(
            isinstance(sub, ast.FunctionDef)
            and sub.name in params
            and _TEMP.search(self.ctx.segment(sub)) is not None
            for sub in self.ctx.tree.body
        )

    def _notebook_wrote_it(self, load: ast.Call, source: ast.expr) -> bool:
        """A notebook runs its cells top to bottom in one session: a file that an earlier
        cell writes (`torch.save`, `trainer.save_checkpoint`, or a checkpoint handler's
        folder) is read back on the machine that wrote it."""
        if not self.ctx.path.endswith(".ipynb"):
            return False
        names, strings = self._path_parts(source, load.lineno)
        files = {s.rsplit("/", 1)[-1] for s in strings if "." in s.rsplit("/", 1)[-1]}
        for sub in walk(self.ctx.tree):
            if not isinstance(sub, ast.Call) or sub.lineno >= load.lineno:
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


def _keyword(call: ast.Call, *names: str) -> ast.expr | None:
    return next((k.value for k in call.keywords if k.arg in names), None)


def _root_name(node: ast.expr) -> str:
    """`self` for `self.model.state_dict()`, `obj` for `obj`."""
    while isinstance(node, ast.Attribute | ast.Call | ast.Subscript):
        node = node.func if isinstance(node, ast.Call) else node.value
    return node.id if isinstance(node, ast.Name) else ""


def _file_names(path: ast.expr) -> set[str]:
    """The file names written in a path expression: `"trainfeat.pth"` in
    `os.path.join(out, "trainfeat.pth")`."""
    return {
        n.value.rsplit("/", 1)[-1]
        for n in walk(path)
        if isinstance(n, ast.Constant) and isinstance(n.value, str) and "." in n.value
    }


def _is_bytes_io(name: str | None) -> bool:
    return name in ("io.BytesIO", "BytesIO")
