from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING, ClassVar

from torchdoctor.check.analysis.device_choice import device_reason
from torchdoctor.check.analysis.device_domain import field_offers, is_option_call, option_offers
from torchdoctor.check.analysis.dropped_device import dropped_device
from torchdoctor.check.analysis.gpu_gates import imports_cuda_only_package
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules._cuda_choice import CUDA_NAME, CudaChoice
from torchdoctor.check.rules._file_gate import skip_visits
from torchdoctor.check.tree_walk import walk

if TYPE_CHECKING:
    from torchdoctor.check.context import FileContext

# "cuda", "cuda:0": a device string naming a CUDA GPU
_CUDA_LITERAL = re.compile(r"cuda(:\d+)?")
# Benchmarks measure particular hardware on purpose.
_BENCHMARK_PATH = re.compile(r"(^|/)bench(mark)?s?(/|_|\.py$)", re.IGNORECASE)
# Functions that ask about a device rather than put something on it.
_PREDICATE = re.compile(
    r"_*(check|is|has|skip|only|require|expect|assert|supports?|match|filter)", re.IGNORECASE
)
_HINT = (
    'choose the device once, e.g. `device = torch.device("cuda" if '
    'torch.cuda.is_available() else "cpu")` (or `td.pick_device()`), and use `.to(device)`'
)
_SETTING_HINT = (
    'default to what the machine has: `"cuda" if torch.cuda.is_available() else "cpu"` '
    '(or an "auto" value resolved that way)'
)


class HardcodedCuda(Rule):
    """`.cuda()` or a `"cuda"` device with no fallback, in code that must run off the GPU too.

    ## What it does
    Finds places that send tensors or modules to a CUDA GPU unconditionally:
    `.cuda()` calls, and the literals `"cuda"` / `"cuda:N"` used as a device
    (`.to("cuda")`, `torch.device("cuda")`, `device="cuda"`, `map_location="cuda"`,
    `device = "cuda"`), where the code shows that it must also run elsewhere:
    - in model code (a method of an `nn.Module` subclass), which runs on whatever
      device its user moves the model to;
    - in a function that already has a device to follow (`x.device`,
      `x.is_cuda`, a `device` parameter), or that combines the CUDA tensor it
      makes with one of its inputs (`ones = torch.eye(n).cuda()` then
      `ones.index_select(0, batch)`);
    - in a file that asks `torch.cuda.is_available()` or `x.is_cuda` elsewhere,
      so it is meant to run without a GPU;
    - in test code, which runs on CPU-only CI machines.

    It also finds a function given a device that builds a project class whose device
    defaults to CUDA without passing it (`self.attn = Attention(dim)` in
    `Block.__init__(self, dim, device)`): the class takes CUDA whatever was chosen.

    And it finds a device setting that declares other devices but defaults to CUDA:
    a command-line option whose choices offer `"cpu"`, `"mps"`, `"xpu"` or `"auto"`
    (`add_argument("--device", default="cuda", choices=["cuda", "cpu"])`,
    `click.option(..., default="cuda", type=click.Choice([...]))`), or a
    configuration field whose `Literal[...]` type or validator
    (`@field_validator("device")`, a `self.device in (...)` test) accepts one: run
    without the option, or with the default configuration, the program fails on
    the machines it says it supports.

    A script that shows no other device was written for a GPU machine; its
    hard-wired CUDA is reported by TD115 (advice, off by default).

    It stays quiet where the author has already made the choice conditional or
    the code is CUDA-only on purpose:
    - a conditional expression (`"cuda" if torch.cuda.is_available() else "cpu"`,
      `x.cuda() if use_gpu else x`), a condition or comparison itself
      (`if x.device == torch.device("cuda")`, `check_device(x, device="cuda")`);
    - inside `if`/`while` blocks, `and`/`or` chains and decorators that mention
      the device (`if torch.cuda.is_available():`, `if args.cuda:`,
      `@unittest.skipIf(not TEST_CUDA, ...)`), after an early exit or assert
      (`if not torch.cuda.is_available(): return`), in test classes whose
      `setUp` (or a base class's) skips without a GPU, and under a GPU-checking
      `pytestmark`; inside a `try` whose handler catches the failure, or a
      `with pytest.raises(...)` block;
    - in files, functions and classes named for the GPU (`test_cuda.py`,
      `def to_gpu`, `class CUDAGraphRunner`), in benchmark files, in files that
      import a GPU-only package (`triton`, `apex`, `transformer_engine`, ...) or
      a CUDA extension the project's setup.py builds (`CUDAExtension(...)`), in
      functions taking a GPU parameter (`def move(batch, gpu_id)`), in blocks
      that also call CUDA-only APIs (`torch.cuda.synchronize()`,
      `torch.cuda.set_device()`, `torch.cuda.Event()`, or a function of the file
      that does), and in functions feeding `torch.distributed` collectives or
      `DistributedDataParallel(..., device_ids=[rank])`, whose tensors must be on
      the process group's GPU;
    - in files that import a GPU-only package on first use (`global
      transformer_engine` then `import transformer_engine` in a function);
    - for default values (`def run(device="cuda")`, a dataclass field, an option)
      that declare no other device: the caller or user chooses; for
      f-strings (`f"cuda:{rank}"`) and GPUs indexed by the process's rank
      (`.cuda(rank)`, `torch.device("cuda", local_rank)`: one GPU per process
      of a distributed job), fake tensors, and `autocast("cuda")` /
      `GradScaler("cuda")`, which only warn without a GPU.

    ## Why is this bad?
    On a machine without a CUDA GPU (a laptop, an Apple-silicon Mac, a CPU CI
    runner) the first such line fails with
    `AssertionError: Torch not compiled with CUDA enabled` or
    `RuntimeError: Found no NVIDIA driver on your system`, so the script cannot
    even be smoke-tested without a GPU, and it cannot use MPS or XPU devices.

    ## Example
    ```python
    model = Net().cuda()
    for images, labels in loader:
        images, labels = images.cuda(), labels.cuda()
    ```

    ## Use instead
    ```python
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model = Net().to(device)
    for images, labels in loader:
        images, labels = images.to(device), labels.to(device)
    ```
    or `device = td.pick_device()`, which also picks MPS/XPU and honours
    `LOCAL_RANK` under torchrun.

    ## References
    - https://pytorch.org/docs/stable/notes/cuda.html#best-practices
    """

    code = "TD101"
    name = "hardcoded-cuda"
    category = "device"
    severity = Severity.ERROR
    # "device": a function given one may drop it (analysis/dropped_device.py)
    triggers: ClassVar[tuple[str, ...]] = ("cuda", "device")
    node_types: ClassVar[tuple[type[ast.AST], ...]] = (ast.Call, ast.Assign, ast.AnnAssign)

    def __init__(self, ctx: FileContext) -> None:
        super().__init__(ctx)
        self._choice = CudaChoice(ctx)
        # a file that never says "cuda" can only drop a device a class defaults to CUDA
        self._dropped_only = "cuda" not in ctx.source
        if self._dropped_only:
            self._file_is_cuda_only = False
            skip_visits(self, keep=(ast.Call,) if ctx.project.cuda_defaults else ())
            return
        path = ctx.project_path
        self._file_is_cuda_only = bool(
            CUDA_NAME.search(path)
            or _BENCHMARK_PATH.search(path)
            or imports_cuda_only_package(ctx.tree, ctx.project.cuda_extensions)
        )
        # Without a "cuda" / 'cuda:0' string, only `.cuda()` calls can be reported.
        self._literals = '"cuda' in ctx.source or "'cuda" in ctx.source
        if self._file_is_cuda_only:
            skip_visits(self)
        elif not self._literals:
            skip_visits(self, keep=(ast.Call,))

    def visit_needles(self) -> tuple[str, ...]:
        # `.cuda()` or a "cuda..." string, or a class whose device defaults to CUDA
        return ("cuda", *self.ctx.project.cuda_defaults)

    # -- what is hardcoded ------------------------------------------------------
    def visit(self, node: ast.AST) -> None:
        if self._file_is_cuda_only:
            return
        if isinstance(node, ast.Call):
            # cheap tests first: most calls name no device at all
            func = node.func
            last = (
                func.attr
                if isinstance(func, ast.Attribute)
                else func.id
                if isinstance(func, ast.Name)
                else ""
            )
            if last in self.ctx.project.cuda_defaults:
                self._check_dropped(node)
            if self._dropped_only:
                return
            if self._literals and is_option_call(node):
                self._check_option(node)
                return
            if last != "cuda" and not (
                self._literals
                and (
                    last in ("device", "set_default_device", "to")
                    or any(kw.arg in ("device", "map_location") for kw in node.keywords)
                )
            ):
                return
            culprit, message = self._check_call(node)
        elif isinstance(node, ast.Assign | ast.AnnAssign):
            if node.value.__class__ is not ast.Constant:
                return  # only a "cuda" string is reported
            if self.ctx.stack and isinstance(self.ctx.stack[-1], ast.ClassDef):
                self._check_field(node, self.ctx.stack[-1])
                return
            culprit, message = self._check_assign(node)
        else:
            return
        if culprit is None or self._choice.guarded([*self.ctx.stack, node]):
            return
        reason = device_reason(self.ctx, [*self.ctx.stack, node], node)
        if self.reports(reason):
            self.report(culprit, message if reason is None else f"{message}: {reason}", hint=_HINT)

    def _check_option(self, call: ast.Call) -> None:
        """A command-line option that offers other devices but defaults to CUDA
        (analysis/device_domain.py): the run without the option fails off the GPU."""
        default = _keyword(call, "default")
        if not _is_cuda_literal(default):
            return
        offers = option_offers(self.ctx, call)
        if not offers or self._choice.guarded(_decorator_chain([*self.ctx.stack, call])):
            return
        if not self.reports(f"its choices offer {_quoted(offers)}"):
            return  # the offer is the evidence the program runs off the GPU: TD101's
        names = [a.value for a in call.args if isinstance(a, ast.Constant)]
        flag = next((n for n in names if isinstance(n, str)), "the option")
        assert default is not None
        self.report(
            default,
            f"`{flag}` defaults to {self.ctx.segment(default)} although its choices offer "
            f"{_quoted(offers)}: run without the option on a machine with no CUDA GPU, "
            "the program fails",
            hint=_SETTING_HINT,
        )

    def _check_field(self, node: ast.Assign | ast.AnnAssign, cls: ast.ClassDef) -> None:
        """A class attribute is a configurable default, like a parameter's: reported only
        where the class declares it accepts other devices (a `Literal` type, a validator)."""
        if not _is_cuda_literal(node.value):
            return
        target = node.target if isinstance(node, ast.AnnAssign) else node.targets[0]
        if not isinstance(target, ast.Name):
            return
        annotation = node.annotation if isinstance(node, ast.AnnAssign) else None
        offers = field_offers(cls, target.id, annotation)
        if not offers or self._choice.guarded([*self.ctx.stack, node]):
            return
        if not self.reports(f"the class accepts {_quoted(offers)}"):
            return
        assert node.value is not None
        self.report(
            node.value,
            f"`{cls.name}.{target.id}` defaults to {self.ctx.segment(node.value)} although "
            f"the class accepts {_quoted(offers)}: the default configuration fails on a "
            "machine with no CUDA GPU",
            hint=_SETTING_HINT,
        )

    def _check_dropped(self, call: ast.Call) -> None:
        """A class whose device defaults to CUDA, built without the device this
        function was given (analysis/dropped_device.py)."""
        message = dropped_device(self.ctx, [*self.ctx.stack, call], call)
        if message is not None and (
            self._dropped_only or not self._choice.guarded([*self.ctx.stack, call])
        ):
            self.report(call, message, hint=_HINT)

    def reports(self, reason: str | None) -> bool:
        """A bug only where the code shows it must run off the GPU too (`reason`);
        a script that simply runs on a GPU is TD115's (advice)."""
        return reason is not None

    def _check_call(self, call: ast.Call) -> tuple[ast.AST | None, str]:
        func = call.func
        if isinstance(func, ast.Attribute) and func.attr == "cuda":
            if self.ctx.qualname(func.value) == "torch" or _per_rank(call.args):
                return None, ""
            receiver = _short(self.ctx.segment(func.value))
            return call, (
                f"`{receiver}.cuda()` moves it to a CUDA GPU unconditionally; "
                "this fails on a machine without one"
            )
        last_name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        device_keyword = next(
            (
                kw
                for kw in call.keywords
                if kw.arg in ("device", "map_location") and _is_cuda_literal(kw.value)
            ),
            None,
        )
        if last_name not in ("device", "set_default_device", "to") and device_keyword is None:
            return None, ""  # cheap test first: most calls name no device at all
        name = self.ctx.call_name(call)
        if name in ("torch.device", "torch.set_default_device"):
            device = call.args[0] if call.args else _keyword(call, "type")
            if _is_cuda_literal(device) and not _per_rank(call.args[1:]):
                return call, (
                    f"`{name}({_short(self.ctx.segment(device))})` names a CUDA GPU "  # type: ignore[arg-type]
                    "with no CPU fallback; this fails on a machine without one"
                )
            return None, ""
        if (
            isinstance(func, ast.Attribute)
            and func.attr == "to"
            and call.args
            and _is_cuda_literal(call.args[0])
        ):
            return call.args[0], (
                f"`.to({self.ctx.segment(call.args[0])})` moves to a CUDA GPU "
                "unconditionally; this fails on a machine without one"
            )
        if "fake" in (name or "").lower():
            return None, ""  # fake tensors only record the device; they need no GPU
        if name == "functools.partial" and call.args:
            name = self.ctx.qualname(call.args[0])
        last = (name or "").rsplit(".", 1)[-1]
        if _PREDICATE.match(last):
            return None, ""  # `check_device(x, device="cuda")` asks; it does not move
        if last in ("GradScaler", "autocast"):
            return None, ""  # without a GPU these warn and disable themselves
        if device_keyword is not None:
            return device_keyword.value, (
                f"`{device_keyword.arg}={self.ctx.segment(device_keyword.value)}` names a "
                "CUDA GPU with no CPU fallback; this fails on a machine without one"
            )
        return None, ""

    def _check_assign(self, node: ast.Assign | ast.AnnAssign) -> tuple[ast.AST | None, str]:
        if not _is_cuda_literal(node.value):
            return None, ""
        targets = node.targets if isinstance(node, ast.Assign) else [node.target]
        for target in targets:
            name = target.id if isinstance(target, ast.Name) else getattr(target, "attr", "")
            if name.lower().endswith("device"):
                assert node.value is not None
                return node.value, (
                    f"`{self.ctx.segment(target)} = {self.ctx.segment(node.value)}` "
                    "hardcodes a CUDA GPU with no CPU fallback; this fails on a "
                    "machine without one"
                )
        return None, ""


def _decorator_chain(chain: list[ast.AST]) -> list[ast.AST]:
    """A decorator runs where its function is defined: the chain up to that function
    (whose decorators mentioning the device are no guard of their own)."""
    for i, node in enumerate(chain[:-1]):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) and any(
            chain[i + 1] is d for d in node.decorator_list
        ):
            return chain[: i + 1]
    return chain


def _quoted(values: list[str]) -> str:
    return ", ".join(f'"{v}"' for v in values)


def _per_rank(args: list[ast.expr]) -> bool:
    """`.cuda(rank)`, `torch.device("cuda", local_rank)`: one GPU per process of a
    distributed job, chosen on purpose (like `f"cuda:{rank}"`)."""
    return any(
        "rank" in (node.id if isinstance(node, ast.Name) else node.attr).lower()
        for arg in args
        for node in walk(arg)
        if isinstance(node, ast.Name | ast.Attribute)
    )


def _is_cuda_literal(node: ast.AST | None) -> bool:
    return (
        isinstance(node, ast.Constant)
        and isinstance(node.value, str)
        and _CUDA_LITERAL.fullmatch(node.value) is not None
    )


def _keyword(call: ast.Call, name: str) -> ast.expr | None:
    for kw in call.keywords:
        if kw.arg == name:
            return kw.value
    return None


def _short(text: str, limit: int = 40) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 3] + "..."
