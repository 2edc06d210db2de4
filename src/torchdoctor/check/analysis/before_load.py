"""What the code around a `torch.load` shows about the machine it runs on (TD402).

- A test helper's load of files the calling test made in its temporary folder.
- A call before the load, on every path, of a project function that `torch.save`s to
  one of its parameters, bound to the very file the load reads (`train(...,
  model_save="best.pt")`, or left at its default `"best.pt"`): this run wrote the
  file, on this machine.
- A CPU fallback: the load sits in a `try:` whose `except` (catching the
  `RuntimeError`) loads the same file with `map_location`, or in a branch of a test
  naming the device whose other branch does.
"""

from __future__ import annotations

import ast
import os
import re
from collections.abc import Iterator
from itertools import pairwise

from torchdoctor.check.analysis.cpu_saves import SAVES, opened_path, save_path
from torchdoctor.check.analysis.file_loops import sibling_file
from torchdoctor.check.analysis.gpu_gates import always_run_calls
from torchdoctor.check.analysis.saved_objects import same_file
from torchdoctor.check.analysis.scope_index import binding
from torchdoctor.check.analysis.wraps import bound_arguments, parameter_slots
from torchdoctor.check.context import FileContext
from torchdoctor.check.tree_walk import block_of, parameter_defaults, walk

# Loaders that unpickle with `torch.load`, and the position of their `map_location`
# parameter: the hub's download helpers pass theirs straight to `torch.load`.
MAP_LOCATION_AT = {
    "torch.load": 1,
    "torch.hub.load_state_dict_from_url": 2,
    "torch.utils.model_zoo.load_url": 2,
    "torchvision.models.utils.load_state_dict_from_url": 2,
    "torchvision._internally_replaced_utils.load_state_dict_from_url": 2,
}
TORCH_LOADS = frozenset(MAP_LOCATION_AT)
# A temporary folder: fresh for each run, so what a test reads from it this run wrote.
TEMP = re.compile(r"\b(tmp_path\w*|tmpdir\w*|tempfile|TemporaryDirectory|mkdtemp|mktemp)\b")
TEMP_PARAMETERS = frozenset({"tmp_path", "tmpdir", "tmp_dir", "dirname", "temp_dir"})
# A test that picks between a GPU and a CPU way of doing things, by the word it names.
_GPU_WORD = re.compile(r"cuda|gpu", re.IGNORECASE)
_CPU_WORD = re.compile(r"cpu", re.IGNORECASE)
_NOT_GPU = re.compile(r"(?:no|not|disable|without)_?(?:cuda|gpu)", re.IGNORECASE)
# Handlers that catch the `RuntimeError` of a CUDA load on a machine without CUDA.
_CATCHES_RUNTIME = frozenset({"RuntimeError", "Exception", "BaseException"})
_FUNCTIONS = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda, ast.ClassDef)
# A function that saves to its parameters: its file, itself, those parameters.
_Saver = tuple[FileContext, ast.FunctionDef | ast.AsyncFunctionDef, list[str]]


def maps_location(ctx: FileContext, call: ast.Call) -> bool:
    """A load call that passes `map_location` (by keyword, by position, or maybe in
    `**kwargs`)."""
    name = ctx.call_name_in(call, TORCH_LOADS)
    if name is None:
        return False
    return len(call.args) > MAP_LOCATION_AT[name] or any(
        kw.arg in ("map_location", None) for kw in call.keywords
    )


def load_source(call: ast.Call) -> ast.expr | None:
    """The file (or url) a load call reads."""
    if call.args:
        return call.args[0]
    return next((k.value for k in call.keywords if k.arg in ("f", "url")), None)


def _preceding_calls(ctx: FileContext, node: ast.AST) -> Iterator[ast.Call]:
    """The calls that run before `node` (being visited) on every path of its function
    or module: those of the statements before each statement holding it, in its block."""
    chain = [*ctx.stack, node]
    for parent, child in reversed(list(pairwise(chain))):
        block = block_of(parent, child)
        for index, stmt in enumerate(block):
            if stmt is child:
                for found in always_run_calls(block[:index], loops_may_skip=True):
                    if isinstance(found, ast.Call):
                        yield found
                break
        if isinstance(parent, _FUNCTIONS):
            return


# -- a CPU fallback -----------------------------------------------------------
def has_cpu_fallback(ctx: FileContext, load: ast.Call, source: ast.expr) -> bool:
    """The code already handles the machine without the saving GPU: the load is in a
    `try:` whose handler of the `RuntimeError` loads the same file with
    `map_location`, or in a branch of a test naming the device (`if use_cuda:`) whose
    other branch does."""
    for parent, child in reversed(list(pairwise([*ctx.stack, load]))):
        if isinstance(parent, _FUNCTIONS):
            return False
        if isinstance(parent, ast.Try) and any(child is s for s in parent.body):
            if any(
                _catches_runtime_error(ctx, handler) and _maps_same(ctx, handler.body, source)
                for handler in parent.handlers
            ):
                return True
        elif isinstance(parent, ast.If | ast.IfExp) and _chosen_device(ctx, parent.test):
            body = parent.body if isinstance(parent.body, list) else [parent.body]
            orelse = parent.orelse if isinstance(parent.orelse, list) else [parent.orelse]
            in_body = any(child is s for s in body)
            if (
                (in_body or any(child is s for s in orelse))
                and _gpu_when(ctx, parent.test) is in_body
                and _maps_same(ctx, orelse if in_body else body, source)
            ):
                return True
    return False


def _gpu_when(ctx: FileContext, test: ast.expr) -> bool | None:
    """Whether `test` holds where the GPU is chosen (True: `use_cuda`,
    `torch.cuda.is_available()`, `device == "cuda"`), where the CPU is (False: `not
    use_gpu`, `args.cpu`, `device.type == "cpu"`), or None: it does not say."""
    if isinstance(test, ast.UnaryOp) and isinstance(test.op, ast.Not):
        inner = _gpu_when(ctx, test.operand)
        return None if inner is None else not inner
    if isinstance(test, ast.Compare) and len(test.ops) == 1:
        right = test.comparators[0]
        if not (isinstance(right, ast.Constant) and isinstance(right.value, str)):
            return None
        says = _names_gpu(right.value)
        if says is None or not isinstance(test.ops[0], ast.Eq | ast.NotEq):
            return None
        return says if isinstance(test.ops[0], ast.Eq) else not says
    if not isinstance(test, ast.Name | ast.Attribute | ast.Call):
        return None
    return _names_gpu(ctx.segment(test))


def _names_gpu(text: str) -> bool | None:
    """True for a name of the GPU (`use_cuda`), False for one of the CPU (`cpu_only`,
    `no_cuda`), None for neither or both."""
    if _NOT_GPU.search(text):
        return None if _GPU_WORD.search(_NOT_GPU.sub("", text)) else False
    gpu, cpu = _GPU_WORD.search(text) is not None, _CPU_WORD.search(text) is not None
    return None if gpu == cpu else gpu


def _chosen_device(ctx: FileContext, test: ast.expr) -> bool:
    """A test naming the device to use, and not a parameter the caller may leave at its
    default (`def load_model(self, path, cpu=False)`: callers on a CPU machine that
    omit it take the GPU branch)."""
    function = ctx.enclosing_function()
    if function is None:
        return True
    defaulted = set(_defaults(function))
    return not any(isinstance(n, ast.Name) and n.id in defaulted for n in walk(test))


def _catches_runtime_error(ctx: FileContext, handler: ast.ExceptHandler) -> bool:
    if handler.type is None:
        return True
    types = handler.type.elts if isinstance(handler.type, ast.Tuple) else [handler.type]
    return any((ctx.segment(t).rsplit(".", 1)[-1]) in _CATCHES_RUNTIME for t in types)


def _maps_same(ctx: FileContext, block: list[ast.stmt] | list[ast.expr], source: ast.expr) -> bool:
    """A load in `block` of the file `source` that passes `map_location`."""
    for node in block:
        for sub in walk(node):
            if isinstance(sub, ast.Call) and maps_location(ctx, sub):
                read = load_source(sub)
                if read is not None and same_file(read, source):
                    return True
    return False


# -- a test's temporary folder ------------------------------------------------
def from_temp_folder(ctx: FileContext, scope: ast.AST, path: ast.expr, depth: int = 6) -> bool:
    """`path` is in a temporary folder of `scope` (`os.path.join(folder, "ep1.pt")` of
    `folder = os.path.join(tmp_path, "run")`, `tmp_path` a parameter of the test, or
    `tempfile.mkdtemp()`): a file of this run."""
    node: ast.expr | None = path
    for _ in range(depth):
        if isinstance(node, ast.Name):
            if node.id in _parameters(scope):
                return node.id in TEMP_PARAMETERS or TEMP.fullmatch(node.id) is not None
            node = binding(ctx, scope, node.id, path.lineno)
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Div):
            node = node.left  # `tmp_path / "model.pt"`
        elif isinstance(node, ast.JoinedStr) and node.values:
            first = node.values[0]  # `f"{tmp_path}/model.pt"`
            node = first.value if isinstance(first, ast.FormattedValue) else None
        elif isinstance(node, ast.Attribute):
            node = node.value  # `tmpdir.strpath`
        elif isinstance(node, ast.Call):
            name = ctx.qualname(node.func) or ""
            if TEMP.search(name) and not node.args:
                return True  # `tempfile.mkdtemp()`
            last = name.rsplit(".", 1)[-1]
            if name in ("os.path.join", "posixpath.join") or last in ("str", "Path", "fspath"):
                node = node.args[0] if node.args else None
            elif last in ("joinpath", "mktemp") and isinstance(node.func, ast.Attribute):
                node = node.func.value  # `tmp_path.joinpath(...)`, `factory.mktemp(...)`
            else:
                return False
        else:
            return False
    return False


def _parameters(scope: ast.AST) -> set[str]:
    if not isinstance(scope, ast.FunctionDef | ast.AsyncFunctionDef):
        return set()
    args = scope.args
    return {a.arg for a in (*args.posonlyargs, *args.args, *args.kwonlyargs)}


# -- a round trip through a project function ----------------------------------
def written_by_earlier_call(ctx: FileContext, load: ast.Call, source: ast.expr) -> bool:
    """A call that runs before the load on every path, of a function of the project
    (of this file, or imported from one) that `torch.save`s to one of its parameters,
    binds that parameter, or leaves it at its default, to the file the load reads:
    the file is written by this run, on this machine."""
    scope = ctx.enclosing_function() or ctx.tree
    wanted = _literal(ctx, scope, source, load.lineno)
    for call in _preceding_calls(ctx, load):
        if not isinstance(call.func, ast.Name):
            continue
        known: dict[str, _Saver | None] = ctx.shared("before_load.savers", lambda _: {})
        if call.func.id not in known:
            known[call.func.id] = _saving_function(ctx, call.func.id)
        found = known[call.func.id]
        if found is None:
            continue
        definer, function, params = found
        slots = parameter_slots(function, method=False)
        passed = dict(bound_arguments(call, slots))
        unknown = any(isinstance(a, ast.Starred) for a in call.args) or any(
            k.arg is None for k in call.keywords
        )
        defaults = _defaults(function)
        for param in params:
            if param in passed:
                arg = passed[param]
                if same_file(arg, source) or (
                    wanted is not None and _literal(ctx, scope, arg, call.lineno) == wanted
                ):
                    return True
            elif (
                not unknown
                and param in defaults
                and wanted is not None
                and _literal(definer, function, defaults[param], function.lineno) == wanted
            ):
                return True
    return False


def _saving_function(ctx: FileContext, name: str) -> _Saver | None:
    """The module-level function `name` names (defined in this file, or imported from
    a file of the project), its file, and its parameters it `torch.save`s to."""
    definer: FileContext | None = ctx
    target = ctx.imports.get(name)
    if target is not None:
        if "." not in target:
            return None
        module, name = target.rsplit(".", 1)
        found = sibling_file(ctx, module, by_tail=True)
        definer = found.ctx if found is not None else None
    if definer is None or "save" not in definer.source:
        return None
    function = None
    for stmt in definer.tree.body:
        if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef) and stmt.name == name:
            function = stmt
    if function is None:
        return None
    params = set(parameter_slots(function, method=False))
    params |= {a.arg for a in function.args.kwonlyargs}
    rebound = _bound_names(function)
    saved: list[str] = []
    for sub in walk(function):
        if not isinstance(sub, ast.Call) or definer.call_name_in(sub, SAVES) is None:
            continue
        path = save_path(sub)
        if path is None:
            continue
        written = opened_path(definer, function, path)
        if (
            isinstance(written, ast.Name)
            and written.id in params
            and written.id not in rebound
            and written.id not in saved
        ):
            saved.append(written.id)
    return (definer, function, saved) if saved else None


def _bound_names(function: ast.FunctionDef | ast.AsyncFunctionDef) -> set[str]:
    """Names the body binds again (assigned, loop targets, parameters of inner
    functions): a parameter among them may not hold the path passed in."""
    found: set[str] = set()
    for node in walk(function):
        if isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            found.add(node.id)
        elif isinstance(node, ast.arg) and _inner_arg(function, node):
            found.add(node.arg)
    return found


def _inner_arg(function: ast.FunctionDef | ast.AsyncFunctionDef, arg: ast.arg) -> bool:
    own = function.args
    return not any(
        arg is a for a in (*own.posonlyargs, *own.args, *own.kwonlyargs, own.vararg, own.kwarg)
    )


def _defaults(function: ast.FunctionDef | ast.AsyncFunctionDef) -> dict[str, ast.expr]:
    return {a.arg: d for a, d in parameter_defaults(function.args)}


def _literal(ctx: FileContext, scope: ast.AST, node: ast.expr, line: int) -> str | None:
    """The file name `node` holds: a string, or a name bound to one before `line` (in
    `scope`, else at the top of the module); normalized (`./best.pt` is `best.pt`)."""
    if isinstance(node, ast.Name):
        bound = binding(ctx, scope, node.id, line)
        if bound is None and scope is not ctx.tree:
            bound = binding(ctx, ctx.tree, node.id, line if scope is ctx.tree else 1 << 30)
        if bound is None:
            return None
        node = bound
    if isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value:
        return os.path.normpath(node.value)
    return None
