from __future__ import annotations

import ast
import re
from typing import ClassVar

from torchdoctor.check.analysis.scope_index import own_calls
from torchdoctor.check.analysis.text_facts import builds_batchnorm1d
from torchdoctor.check.analysis.torch_api import LIBRARY
from torchdoctor.check.rule import Rule, Severity
from torchdoctor.check.rules._unpicklable import Finder
from torchdoctor.check.tree_walk import walk, walk_statements

_LOADERS = frozenset({"torch.utils.data.DataLoader", "torch.utils.data.dataloader.DataLoader"})
# DataLoader's positional parameters, in order.
_POSITIONAL = ("dataset", "batch_size", "shuffle", "sampler", "batch_sampler")
_TRAIN = re.compile(r"tr(ai)?n", re.IGNORECASE)
_NOT_TRAIN = re.compile(r"(^|[^a-z])(val|test|tst|eval|dev|pred|infer)", re.IGNORECASE)


class BatchNormPartialBatch(Rule):
    """BatchNorm trained on a DataLoader whose last batch can hold a single sample.

    ## What it does
    In a file that builds a `BatchNorm1d` layer, or a model class of the project that
    builds one (itself or through the classes it builds), finds a training `DataLoader` -- one that
    shuffles (`shuffle=True`) or is named for training (`train_loader`,
    `train_dataloader()`), and is not named for validation or testing -- that keeps the
    last, partial batch: no `drop_last=True`, also not in a `**kwargs` dict it is given
    (a dict the rule cannot read keeps it quiet), and no custom `sampler` or
    `batch_sampler`. When the dataset's length is known (torchvision's MNIST, CIFAR10,
    ... in `library.toml`), it reports only a batch size -- a number, or an `argparse`
    default -- that leaves exactly one sample.

    Off by default (select `TD216`): whether the last batch holds exactly one sample
    depends on the dataset's length, which the code rarely shows -- one dataset size in
    `batch_size` hits it. It is a trap that waits for the data to change.

    ## Why is this bad?
    When `len(dataset) % batch_size == 1`, the last batch of every epoch has one sample.
    A BatchNorm layer in training mode that then sees one value per channel
    (`BatchNorm1d` on `(N, C)` features, or a `BatchNorm2d` after global pooling)
    raises `ValueError: Expected more than 1 value per channel when training` -- at the
    end of the first epoch, after a whole epoch of compute. Slightly larger partial
    batches do not crash but give noisy statistics that leak into the running averages.

    ## Example
    ```python
    loader = DataLoader(train_set, batch_size=32, shuffle=True)
    ```

    ## Use instead
    ```python
    loader = DataLoader(train_set, batch_size=32, shuffle=True, drop_last=True)
    ```

    ## Fix safety
    No fix is offered: `drop_last=True` skips up to `batch_size - 1` samples an epoch
    (a different sample each epoch when shuffling), which a small dataset may notice.

    ## References
    - https://pytorch.org/docs/stable/data.html#torch.utils.data.DataLoader
    - https://pytorch.org/docs/stable/generated/torch.nn.BatchNorm1d.html
    """

    code = "TD216"
    name = "batchnorm-partial-batch"
    category = "data"
    severity = Severity.WARNING
    default_enabled = False
    triggers: ClassVar[tuple[str, ...]] = ("DataLoader",)

    def finish(self) -> None:
        if not self._trains_batchnorm():
            return
        for scope in walk_statements(self.ctx.tree):
            if not isinstance(scope, ast.Module | ast.FunctionDef | ast.AsyncFunctionDef):
                continue
            finder: Finder | None = None
            for call in own_calls(self.ctx, scope):
                name = self.ctx.qualname(call.func) or ""
                if name not in _LOADERS and name != "DataLoader":
                    continue
                finder = finder or Finder(self.ctx, scope)
                args = self._arguments(call, finder, scope)
                if args is None or not self._trains(call, args, scope):
                    continue
                if self._keeps_partial_batch(args) and self._may_end_with_one(args, finder, call):
                    self._report(call, args)

    def _trains_batchnorm(self) -> bool:
        """This file builds a BatchNorm1d, or builds a model class of the project that does
        (directly or through the classes it builds)."""
        if builds_batchnorm1d(self.ctx.source):
            return True
        classes = self.ctx.project.batchnorm_classes
        # (a name is spelt in the text: a file that spells none of them calls none)
        source = self.ctx.source
        return any(name in source for name in classes) and any(
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Name)
            and node.func.id in classes
            and self.ctx.imports.get(node.func.id, "").split(".", 1)[0] != "torch"
            for node in walk(self.ctx.tree)
        )

    def _arguments(
        self, call: ast.Call, finder: Finder, scope: ast.AST
    ) -> dict[str, ast.expr] | None:
        """The loader's arguments by name, `**kwargs` dicts read; None if one is unknown."""
        args: dict[str, ast.expr] = dict(zip(_POSITIONAL, call.args, strict=False))
        if any(isinstance(a, ast.Starred) for a in call.args):
            return None
        for kw in call.keywords:
            if kw.arg is not None:
                args[kw.arg] = kw.value
                continue
            spread = self._dict_value(kw.value, finder, scope, call.lineno)
            if spread is None:
                return None
            args.update(spread)
        return args

    def _dict_value(
        self, expr: ast.expr, finder: Finder, scope: ast.AST, line: int
    ) -> dict[str, ast.expr] | None:
        """The items of a `dict(...)` call or `{...}` literal `expr` is (or is bound to)."""
        if isinstance(expr, ast.Name):
            bound = finder.binding(expr.id, line)
            return self._dict_value(bound, finder, scope, line) if bound is not None else None
        if isinstance(expr, ast.Attribute) and isinstance(expr.value, ast.Name):
            if expr.value.id == "self":
                bound = self._self_binding(scope, expr.attr)
                return self._dict_value(bound, finder, scope, line) if bound else None
            return None
        if isinstance(expr, ast.Dict):
            if any(key is None for key in expr.keys):
                return None
            found = {}
            for key, value in zip(expr.keys, expr.values, strict=True):
                if not (isinstance(key, ast.Constant) and isinstance(key.value, str)):
                    return None
                found[key.value] = value
            return found
        if isinstance(expr, ast.Call) and self.ctx.qualname(expr.func) == "dict" and not expr.args:
            if any(kw.arg is None for kw in expr.keywords):
                return None
            return {kw.arg: kw.value for kw in expr.keywords if kw.arg is not None}
        return None

    def _self_binding(self, scope: ast.AST, attr: str) -> ast.expr | None:
        """The single value the class of method `scope` assigns to `self.attr`."""
        for cls in walk_statements(self.ctx.tree):
            if not (isinstance(cls, ast.ClassDef) and any(m is scope for m in cls.body)):
                continue
            values = [
                node.value
                for node in walk_statements(cls)
                if isinstance(node, ast.Assign)
                and any(
                    isinstance(t, ast.Attribute)
                    and t.attr == attr
                    and isinstance(t.value, ast.Name)
                    and t.value.id == "self"
                    for t in node.targets
                )
            ]
            return values[0] if len(values) == 1 else None
        return None

    def _trains(self, call: ast.Call, args: dict[str, ast.expr], scope: ast.AST) -> bool:
        names = [getattr(scope, "name", "")]
        for node in own_calls_parents(scope, call):
            names.extend(_target_names(node))
        names.append(self.ctx.segment(args["dataset"]) if "dataset" in args else "")
        if any(_NOT_TRAIN.search(n) for n in names if n):
            return False
        shuffle = args.get("shuffle")
        if isinstance(shuffle, ast.Constant) and shuffle.value is True:
            return True
        return any(_TRAIN.search(n) for n in names if n)

    def _keeps_partial_batch(self, args: dict[str, ast.expr]) -> bool:
        drop = args.get("drop_last")
        if drop is not None and not (isinstance(drop, ast.Constant) and drop.value is False):
            return False
        for name in ("sampler", "batch_sampler"):
            given = args.get(name)
            if given is not None and not (isinstance(given, ast.Constant) and given.value is None):
                return False
        size = args.get("batch_size")  # none given: batches of one anyway
        return size is not None and not (isinstance(size, ast.Constant) and size.value in (None, 1))

    def _may_end_with_one(self, args: dict[str, ast.expr], finder: Finder, call: ast.Call) -> bool:
        """Unless the dataset's length is known (a torchvision dataset of library.toml): then
        only when the batch size is known too and leaves exactly one sample."""
        dataset = args.get("dataset")
        length = self._dataset_length(dataset, finder, call.lineno)
        if length is None and dataset is not None:
            length = self._length_in_code(dataset)
        if length is None:
            return True
        if length < 0:
            return False  # made in memory: its length is the program's own choice
        size = self._int_value(args["batch_size"], finder, call.lineno)
        return size is not None and size > 1 and length % size == 1

    def _dataset_length(self, expr: ast.expr | None, finder: Finder, line: int) -> int | None:
        if isinstance(expr, ast.Name):
            expr = finder.binding(expr.id, line)
        if not isinstance(expr, ast.Call):
            return None
        name = (self.ctx.qualname(expr.func) or "").rsplit(".", 1)[-1]
        lengths = LIBRARY["dataset_lengths"].get(name)
        if lengths is None:
            return None
        train = next((k.value for k in expr.keywords if k.arg == "train"), None)
        split = next((k.value for k in expr.keywords if k.arg == "split"), None)
        if isinstance(split, ast.Constant):
            return int(lengths[0 if split.value == "train" else 1])
        if train is None or (isinstance(train, ast.Constant) and train.value is True):
            return int(lengths[0])
        if isinstance(train, ast.Constant) and train.value is False:
            return int(lengths[1])
        return None

    def _length_in_code(self, dataset: ast.expr) -> int | None:
        """The dataset bound anywhere in the file (also by unpacking, also as `self.x`) to
        a part of `random_split(ds, [n1, n2])` (its literal length), or to a
        `TensorDataset` (-1: in memory, a length the code chose)."""
        text = self.ctx.segment(dataset)
        for node in walk_statements(self.ctx.tree):
            if not isinstance(node, ast.Assign) or not isinstance(node.value, ast.Call):
                continue
            callee = (self.ctx.qualname(node.value.func) or "").rsplit(".", 1)[-1]
            for target in node.targets:
                parts = target.elts if isinstance(target, ast.Tuple | ast.List) else [target]
                for index, part in enumerate(parts):
                    if self.ctx.segment(part) != text:
                        continue
                    if callee == "TensorDataset":
                        return -1
                    if callee == "random_split" and len(node.value.args) > 1:
                        sizes = node.value.args[1]
                        if (
                            isinstance(sizes, ast.List | ast.Tuple)
                            and index < len(sizes.elts)
                            and len(parts) > 1
                        ):
                            size = sizes.elts[index]
                            if isinstance(size, ast.Constant) and type(size.value) is int:
                                return size.value
                            return -1
        return None

    def _int_value(self, expr: ast.expr, finder: Finder, line: int) -> int | None:
        """A literal, a name bound to one, or `args.batch_size` with an argparse default."""
        if isinstance(expr, ast.Name):
            bound = finder.binding(expr.id, line)
            return self._int_value(bound, finder, line) if bound is not None else None
        if isinstance(expr, ast.Constant) and type(expr.value) is int:
            return expr.value
        if isinstance(expr, ast.Attribute):
            return self._argparse_default(expr.attr)
        return None

    def _argparse_default(self, dest: str) -> int | None:
        for node in walk(self.ctx.tree):
            if not (
                isinstance(node, ast.Call)
                and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"
                and node.args
                and isinstance(node.args[0], ast.Constant)
                and str(node.args[0].value).lstrip("-").replace("-", "_") == dest
            ):
                continue
            default = next((k.value for k in node.keywords if k.arg == "default"), None)
            if isinstance(default, ast.Constant) and type(default.value) is int:
                return default.value
        return None

    def _report(self, call: ast.Call, args: dict[str, ast.expr]) -> None:
        size = self.ctx.segment(args["batch_size"])
        self.report(
            call,
            f"this training DataLoader keeps the last, partial batch (no `drop_last=True`), "
            f"and the model trained here has BatchNorm1d layers: when `len(dataset) % {size} == 1` "
            "the last batch holds one sample and BatchNorm raises 'Expected more than 1 "
            "value per channel when training'",
            hint="pass `drop_last=True` to the training loader",
        )


def own_calls_parents(scope: ast.AST, call: ast.Call) -> list[ast.stmt]:
    """The statements of `scope` that hold `call` (an assignment names the loader)."""
    return [
        stmt
        for stmt in walk_statements(scope)
        if isinstance(stmt, ast.Assign | ast.AnnAssign | ast.Return)
        and any(node is call for node in walk(stmt))
    ]


def _target_names(stmt: ast.stmt) -> list[str]:
    targets = stmt.targets if isinstance(stmt, ast.Assign) else []
    if isinstance(stmt, ast.AnnAssign):
        targets = [stmt.target]
    return [ast.unparse(t) for t in targets]
