from __future__ import annotations

import ast
import re
from typing import ClassVar

from torchdoctor.check.analysis.default_path import default_text
from torchdoctor.check.analysis.file_flow import file_flow
from torchdoctor.check.analysis.loop_splits import LoopSplit
from torchdoctor.check.analysis.scope import ScopeFlow
from torchdoctor.check.analysis.syntax import dotted, lines_matching
from torchdoctor.check.analysis.torch_api import FACTORIES, LEGACY_CONSTRUCTORS
from torchdoctor.check.analysis.values import Kind, Mismatch, Place, ScopeNode, Value
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.tree_walk import walk_statements

# Batch fields that are meant to stay on the CPU (pack_padded_sequence wants CPU
# lengths) or are not tensors at all (file names, ids of samples).
_STAYS_ON_CPU = re.compile(
    r"(?:^|_)(?:lens?|lengths?|seq_lens?|sizes?|counts?|num|n|idx|index|indices|paths?|"
    r"files?|filenames?|names?|meta|metadata|infos?|texts?|captions?|strings?|prompts?)(?:$|_)",
    re.IGNORECASE,
)
# Where batches come from: the scopes worth analysing iterate a loader (strong), or
# iterate batches and move something (weak).
# (Line patterns, tried only on the lines holding their words: see lines_matching.)
_LOADER_WORDS = ("loader", "Loader", "_dl", "batches")
_FOR_IN_LOADER = re.compile(
    r"[ \t]*(?:async[ \t]+)?for[ \t](?>[^\r\n]*?\bin\b)[^\r\n]*?(?:loader|Loader|_dl\b|batches)"
)
# a `for` header that goes on past its line (`for i, batch in tqdm(` ... `loader)`)
_FOR_OPEN = re.compile(r"[ \t]*(?:async[ \t]+)?for[ \t][^\r\n]*\bin\b[^\r\n#]*[(\[,][ \t]*$")
_NEXT_ITER = re.compile(r"next\(\s*iter\(")
_FOR_IN_BATCHES = re.compile(r"[ \t]*(?:async[ \t]+)?for[ \t][^\r\n]*batch")
_MOVES = (".to(", ".cuda(")
_FACTORY_CALLS = tuple(f".{name}(" for name in sorted(FACTORIES | LEGACY_CONSTRUCTORS))
_ENCODED = re.compile(r"return_tensors\s*=\s*[\"']pt[\"']")


class BatchNotMoved(Rule):
    """A batch (or a tensor made on the CPU) reaches a model that was moved to a device.

    ## What it does
    Follows each batch drawn from a `DataLoader` to the places it is used, and
    reports a batch tensor that reaches a model that was moved with
    `model.to(device)` / `.cuda()` / `Net().to(device)` — or meets the model's
    output in a loss or a comparison — without being moved itself. It catches the
    classic slips: the evaluation function that forgets the `.to(device)` the
    training loop has, labels or masks left behind while the inputs move, hidden
    states created on the CPU, and `x.to(device)` whose result was dropped. It
    follows models and loaders into helper functions (`evaluate(model, val_loader)`),
    also when the helper lives in another file, and into a method of a model class
    that another file calls on the model it moved (`model.read(images=batch)`): the
    meeting is reported in the method. What a tokenizer or a processor
    returns with `return_tensors="pt"` is made on the CPU too, and
    `model.generate(...)` runs the model on the tensors it is given. A loop that
    passes a moved model's method (`policy.act(obs, masks)`) a value made on the
    device before the loop, and rebinds it with a factory without `device=` at the
    end of its body, is reported at that rebinding: from the second iteration on the
    method gets a CPU tensor where the first got one on the device.

    ## Why is this bad?
    On a GPU machine the first such batch stops the run with
    `RuntimeError: Expected all tensors to be on the same device, but found at
    least two devices, cuda:0 and cpu!` — often only in the evaluation at the end
    of the first epoch, after an hour of training. On a CPU-only laptop the code
    runs fine, so the bug ships.

    ## Example
    ```python
    model = Net().to(device)

    def evaluate(model, loader):
        for images, labels in loader:
            outputs = model(images)  # images are still on the CPU
            loss = criterion(outputs, labels)
    ```

    ## Use instead
    ```python
    def evaluate(model, loader):
        for images, labels in loader:
            images, labels = images.to(device), labels.to(device)
            outputs = model(images)
            loss = criterion(outputs, labels)
    ```
    or iterate `td.DeviceLoader(loader)`, which moves every batch for you.

    Fields that must stay on the CPU (`lengths` for `pack_padded_sequence`, file
    names) are not reported.

    ## References
    - https://pytorch.org/docs/stable/notes/cuda.html
    - https://pytorch.org/tutorials/beginner/blitz/cifar10_tutorial.html#training-on-gpu
    """

    code = "TD112"
    name = "batch-not-moved"
    category = "device"
    severity = Severity.ERROR
    triggers: ClassVar[tuple[str, ...]] = ("loader", "Loader", "batch", "next(", ".to(", ".cuda(")
    node_types: ClassVar[tuple[type[ast.AST], ...]] = ()

    def finish(self) -> None:
        source = self.ctx.source
        line_of = self.ctx.line_of_offset
        strong = lines_matching(self.ctx, _LOADER_WORDS, _FOR_IN_LOADER)
        holding = self.ctx.lines_holding(_LOADER_WORDS) if strong or "for" in source else []
        if len(holding) > len(strong):
            strong = sorted({*strong, *_continued_headers(self.ctx.lines, holding, strong)})
        if "next(" in source or "DataLoader(" in source:
            strong.extend(line_of(m.start()) for m in _NEXT_ITER.finditer(source))
            strong.extend(self.ctx.lines_holding(("DataLoader(",)))
            strong.sort()
        if "return_tensors" in source:  # a tokenizer's output: tensors made on the CPU
            strong.extend(line_of(m.start()) for m in _ENCODED.finditer(source))
            strong.sort()
        weak = lines_matching(self.ctx, ("batch",), _FOR_IN_BATCHES)
        # module-level code (a script, a notebook) is cheap: analysed whenever it moves
        script = any(m in source for m in _MOVES)
        called = self._called_methods()
        if not strong and not weak and not script and not called:
            return
        ff = file_flow(self.ctx)
        scopes: list[ScopeNode] = [ff.ctx.tree] if script else []
        scopes += called
        scopes += [s for s in ff.scopes_at(strong) if s not in scopes]
        scopes += [s for s in ff.scopes_at(weak) if s not in scopes and ff.mentions(s, *_MOVES)]
        if script:
            # a plain function that moves a model and makes a tensor on the CPU (a rollout
            # whose hidden state is reset with `torch.zeros(n)`)
            made = ff.scopes_at(self.ctx.lines_holding(_FACTORY_CALLS))
            scopes += [
                s
                for s in made
                if s not in scopes
                and not isinstance(s, ast.Module)
                and ff.class_of(s) is None
                and ff.mentions(s, *_MOVES)
            ]
        if script:
            # a method that moves something, of a plain class the file builds: what the
            # file's calls on its instances pass (a factory's CPU tensor) may meet it
            built = {
                name
                for name, cls in ff.classes.items()
                if f"{name}(" in source and not ff.is_module_class(cls)
            }
            if built:
                for s in ff.scopes_at(self.ctx.lines_holding(_MOVES)):
                    cls = ff.class_of(s) if not isinstance(s, ast.Module) else None
                    if cls is not None and cls.name in built and s not in scopes:
                        scopes.append(s)
        self._checked = set(scopes)
        for node in scopes:
            if not isinstance(node, ast.Module):
                cls = ff.class_of(node)
                if cls is not None and ff.is_module_class(cls) and node not in called:
                    continue  # inside a module: TD103/TD104 speak about its tensors
            self._check_scope(ff.scope(node))

    def _called_methods(self) -> list[ScopeNode]:
        """Methods of the file's module classes that other files call on a module they
        hold (`model.read(images=batch)`, analysis/method_facts.py): what those calls
        pass meets the module's layers here."""
        project = self.ctx.project
        wanted = project.method_classes
        if not wanted or not any(f"class {name}" in self.ctx.source for name in wanted):
            return []
        ff = file_flow(self.ctx)
        found: list[ScopeNode] = []
        for name, cls in ff.classes.items():
            if name not in wanted or not ff.is_module_class(cls):
                continue
            for method_name, method in ff.methods(cls).items():
                if method_name in ("__init__", "forward"):
                    continue
                if project.call_facts_for(f"{name}.{method_name}", self.ctx.path):
                    found.append(method)
        return found

    def _check_scope(self, scope: ScopeFlow) -> None:
        by_site: dict[ast.AST, list[Mismatch]] = {}
        seen: set[str] = set()
        for m in sorted(scope.mismatches, key=lambda m: _position(m.cpu_node)):
            if not self._qualifies(scope, m):
                continue
            name = self.ctx.segment(m.cpu_node)
            if name in seen:
                continue  # one report per value and scope: its first crash
            seen.add(name)
            by_site.setdefault(m.site, []).append(m)
        for site_mismatches in by_site.values():
            self._report_site(site_mismatches)
        reported: set[int] = set()
        for split in scope.loop_splits:
            if id(split.carried.source) not in reported and self._split_qualifies(split):
                reported.add(id(split.carried.source))
                self._report_split(split)

    def _qualifies(self, scope: ScopeFlow, m: Mismatch) -> bool:
        if m.callee is not None and m.callee in self._checked and m.inner is not None:
            # a helper this rule checks too: report where they meet, once
            helper = file_flow(self.ctx).scope(m.callee)  # type: ignore[arg-type]
            if any(_same_value(i.cpu, m.inner.cpu) for i in helper.mismatches):
                return False
        other, cpu = m.other, m.cpu
        if other.assumed or other.is_input or cpu.is_input or other.place is not Place.DEVICE:
            return False
        if m.via == "module" and isinstance(m.site, ast.Call):
            callee = (dotted(m.site.func) or "").lower()
            if "pipe" in callee:
                return False  # diffusers/transformers pipelines move their inputs themselves
            if other.cls and other.cls in self.ctx.project.moving_classes:
                return False  # its forward moves its inputs (`x = x.to(self.device)`)
        last = (dotted(m.cpu_node) or "").rsplit(".", 1)[-1]
        if isinstance(m.cpu_node, ast.Subscript):
            key = m.cpu_node.slice
            if isinstance(key, ast.Constant) and isinstance(key.value, str):
                last = key.value  # batch["lengths"]
        if last and _STAYS_ON_CPU.search(last):
            return False
        if cpu.kind is Kind.BATCH:
            # a batch of an iterable only *named* like a loader: believe it is on the CPU
            # only when this scope moves another part of the same batch
            return not cpu.assumed or (cpu.name, cpu.line) in scope.moved_origins
        return (
            cpu.kind is Kind.TENSOR
            and isinstance(cpu.source, ast.Call)
            and not cpu.assumed
            and isinstance(m.cpu_node, ast.Name | ast.Attribute | ast.Subscript)
        )

    def _split_qualifies(self, split: LoopSplit) -> bool:
        model = split.model
        if model.cls and model.cls in self.ctx.project.moving_classes:
            return False  # its forward moves its inputs (`x = x.to(self.device)`)
        if "pipe" in (dotted(split.site.func) or "").lower():
            return False  # pipelines move their inputs themselves
        last = (dotted(split.node) or "").rsplit(".", 1)[-1]
        return not (last and _STAYS_ON_CPU.search(last))

    def _report_split(self, split: LoopSplit) -> None:
        """At the rebinding: the loop's first iteration passes the value on the device,
        the next ones the tensor made here on the CPU."""
        source = split.carried.source
        assert isinstance(source, ast.Call)
        name = self.ctx.segment(split.node)
        entry, model = split.entry, split.model
        device = entry.device or model.device or "device"
        made = dotted(source.func) or "a factory"
        call = " ".join(self.ctx.segment(split.site.func).split())
        first = f", {entry.where_line(entry.device_line)}" if entry.device_line else ""
        message = (
            f"`{name}` is rebound here on the CPU (`{made}` without `device=`), and the "
            f"loop's next iteration passes it to `{call}(...)` ({_moved(model)}); the first "
            f"iteration passes it on `{device}` (bound before the loop{first}); create it "
            f"with `device={device}`"
        )
        self.report(_rebinding(split.loop, source, split.node), message)

    def _report_site(self, mismatches: list[Mismatch]) -> None:
        first = mismatches[0]
        other = first.other
        # (a tensor an object keeps, carried into its method: `norm.mean`)
        names = ", ".join(f"`{m.attribute or self.ctx.segment(m.cpu_node)}`" for m in mismatches)
        plural = len(mismatches) > 1
        cpu = first.cpu
        device = other.device or "device"
        if cpu.kind is Kind.BATCH:
            what = f"{names} from {cpu.describe_origin()}"
        else:
            made = cpu.name or "a factory"
            what = (
                f"{names} {'are' if plural else 'is'} created on the CPU at "
                f"{cpu.where_line(cpu.line)} (`{made}` without `device=`) and"
            )
        dropped = ""
        if cpu.dropped_line:
            dropped = f" (the result of its `.to()` at line {cpu.dropped_line} was dropped)"
        verb_reach = "reach" if plural and cpu.kind is Kind.BATCH else "reaches"
        verb_meet = "meet" if plural and cpu.kind is Kind.BATCH else "meets"
        if (
            first.via == "module"
            and isinstance(first.site, ast.Call)
            and (first.other_node is first.site.func)
        ):
            model = self.ctx.segment(first.other_node)
            message = f"{what}{dropped} {verb_reach} `{model}` ({_moved(other)})"
        else:
            target = self.ctx.segment(first.other_node)
            where = _site_text(self.ctx.segment(first.site), first)
            message = f"{what}{dropped} {verb_meet} `{target}` ({_on_device(other)}) in {where}"
        if first.path:
            message += f" ({first.path})"
        if first.later:  # the value the previous iteration left (fine on the first one)
            message += " on the loop's next iteration"
        if cpu.default_of:  # `if level > 0: batch = batch.to(device)`, level unset
            message += f" ({default_text(cpu.default_of)})"
        if cpu.kind is Kind.BATCH:
            message += f" without `.to({device})`"
        else:
            message += f"; create {'them' if plural else 'it'} with `device={device}`"
        self.report(first.cpu_node, message)


def _continued_headers(lines: list[str], holding: list[int], found: list[int]) -> list[int]:
    """Of the lines `holding` a loader's name, those continuing a `for` header (black's
    `for i, data in iterate_tqdm(` / `enumerate(loader), ...`): the header's line."""
    headers = []
    known = set(found)
    for number in holding:
        if number in known:
            continue
        for back in range(number - 1, max(number - 3, 0), -1):
            if _FOR_OPEN.match(lines[back - 1]):
                headers.append(back)
                break
    return headers


def _rebinding(loop: ast.stmt, source: ast.Call, node: ast.expr) -> ast.expr:
    """The target the loop binds to the tensor `source` makes (`masks = torch.zeros(n)`),
    named as the use names it; the call itself when not found."""
    text = dotted(node)
    for stmt in walk_statements(loop):
        if isinstance(stmt, ast.Assign) and stmt.value is source:
            for target in stmt.targets:
                if dotted(target) == text:
                    return target
    return source


def _same_value(a: Value, b: Value) -> bool:
    return a == b or (a.source is not None and a.source is b.source)


def _position(node: ast.AST) -> tuple[int, int]:
    return getattr(node, "lineno", 0), getattr(node, "col_offset", 0)


def _moved(value: Value) -> str:
    if value.device_line:
        when = " when that branch runs" if value.maybe else ""
        return f"moved to `{value.device}` at {value.where_line(value.device_line)}{when}"
    return "on the device"


def _on_device(value: Value) -> str:
    place = f"on `{value.device}`" if value.device else "on the device"
    if value.output and value.name:
        return f"the {value.name}, {place}"
    if value.name.startswith("output of"):
        return f"computed from the {value.name}, {place}"
    if value.device_line:
        when = " when that branch runs" if value.maybe else ""
        return f"{place} since {value.where_line(value.device_line)}{when}"
    return place


def _site_text(text: str, m: Mismatch) -> str:
    text = " ".join(text.split())
    if len(text) > 60:
        if isinstance(m.site, ast.Call):
            return f"`{' '.join(text.split('(', 1)[0].split())}(...)`"
        return "an operation"
    return f"`{text}`"
