"""The one catalogue of rule codes, shared by `check`, the guard and `explain`.

Static rules document themselves in their own files (`check/rules/`); the
codes that only the runtime raises, and the engine's own codes, are listed
here. Every code is stable and never reused.
"""

from __future__ import annotations

import functools
import inspect
from dataclasses import dataclass

from torchdoctor.catalog_multigpu import ENTRIES
from torchdoctor.check.registry import rule_classes
from torchdoctor.check.rule import FixAvailability, Severity

DOCS_URL = "https://torchdoctor.readthedocs.io/en/latest/rules/{code}/"


@dataclass(frozen=True)
class RuleInfo:
    code: str
    name: str
    category: str
    severity: Severity
    fix: FixAvailability
    default_enabled: bool
    doc: str
    kind: str  # "static" (a check rule), "runtime" (guard/simulate/explain only), "engine"
    group: str = "bugs"  # "bugs" (the code is wrong) or "advice" (opt-in: portability, style)

    @property
    def summary(self) -> str:
        return self.doc.split("\n", 1)[0].strip()

    @property
    def url(self) -> str:
        return DOCS_URL.format(code=self.code)


def _info(code: str, name: str, category: str, severity: Severity, kind: str, doc: str) -> RuleInfo:
    return RuleInfo(
        code, name, category, severity, FixAvailability.NONE, True, inspect.cleandoc(doc), kind
    )


ENGINE_RULES: tuple[RuleInfo, ...] = (
    _info(
        "TD001",
        "unparsable-file",
        "engine",
        Severity.ERROR,
        "engine",
        """
        The file could not be read or parsed, so nothing in it was checked.

        ## What it does
        Reports a file that is not valid Python for the running interpreter, cannot be
        decoded with its declared encoding, or cannot be read at all. The rest of the
        run goes on. In a notebook, a code cell that is not Python on its own (Jupyter
        compiles each cell apart) is reported at that cell and left out; the other
        cells are checked.

        ## Use instead
        Fix the syntax error, or exclude the file (`--extend-exclude`).
        """,
    ),
    _info(
        "TD900",
        "internal-error",
        "engine",
        Severity.ERROR,
        "engine",
        """
        A torchdoctor rule crashed on this file; its other rules still ran.

        ## What it does
        Reports an unexpected exception inside one rule, naming the rule, instead of
        stopping the run with a traceback. Please report it with the file that caused it.
        """,
    ),
)

# Codes raised only at run time (guard, virtual accelerator, explain): no static rule.
RUNTIME_RULES: tuple[RuleInfo, ...] = (
    _info(
        "TD120",
        "device-mismatch-at-call",
        "device",
        Severity.ERROR,
        "runtime",
        """
        A model call failed because its tensors were on different devices; the guard names which.

        ## What it does
        Raised by `td.guard(model)` and `torchdoctor run` (and reported by `td.explain`) when
        a forward fails with a device mismatch. It reads the traceback — no hooks on the hot
        path — and names the failing submodule by its path, its parameters and their devices,
        and the input (by the name `forward` gave it) or the tensor made in `forward` that is
        on another device.

        ## Why is this bad?
        PyTorch's own message names two devices and an op (`wrapper_CUDA_addmm`), not the
        layer, the parameter or the batch field at fault. In a deep model that leaves the
        search to the user.

        ## Example
        ```python
        model = Net().to("cuda")
        with td.guard(model):
            model(x_on_cpu)   # DeviceMismatchError: TD120 `encoder.0` (Linear) ...
        ```

        ## Use instead
        ```python
        model(x_on_cpu.to("cuda"))          # or td.to_device(batch, device)
        ```
        """,
    ),
    _info(
        "TD210",
        "batchnorm-single-sample",
        "training",
        Severity.WARNING,
        "runtime",
        """
        A BatchNorm layer in training mode got a batch of one sample (or a tiny last batch).

        ## What it does
        The guard watches the first steps of BatchNorm layers in training mode and warns when
        a batch has one sample — which crashes (`Expected more than 1 value per channel when
        training`) when there is one value per channel — or is tiny compared with the batches
        seen before.

        ## Why is this bad?
        Training-mode BatchNorm normalises with the current batch's statistics. One sample
        has no variance (a crash), and a tiny last batch gives noisy statistics that also
        update the running averages used at evaluation time.

        ## Example
        ```python
        loader = DataLoader(ds, batch_size=32)       # len(ds) % 32 == 1
        model.train()
        for x, y in loader: ...
        ```

        ## Use instead
        ```python
        loader = DataLoader(ds, batch_size=32, drop_last=True)
        model.eval()                                 # for single-sample inference
        ```
        """,
    ),
    _info(
        "TD211",
        "train-mode-inference",
        "training",
        Severity.WARNING,
        "runtime",
        """
        A forward ran under `no_grad`/`inference_mode` with Dropout/BatchNorm in training mode.

        ## What it does
        The guard checks the first calls of a model: gradients are off (evaluation code) but
        Dropout or BatchNorm submodules are still in training mode.

        ## Why is this bad?
        Dropout keeps dropping activations and BatchNorm uses batch statistics (and updates
        its running averages), so evaluation metrics are noisy and wrong, and evaluating
        changes the model.

        ## Example
        ```python
        with torch.no_grad():
            accuracy = evaluate(model, val_loader)   # model still in train mode
        ```

        ## Use instead
        ```python
        model.eval()
        with torch.no_grad():
            accuracy = evaluate(model, val_loader)
        model.train()
        ```
        """,
    ),
    _info(
        "TD212",
        "grad-accumulated-unintentionally",
        "training",
        Severity.WARNING,
        "runtime",
        """
        `optimizer.step()` ran twice with no `zero_grad()` in between, and gradients piled up.

        ## What it does
        The guard watches the first optimizer steps: if a parameter's gradient from before
        the previous step was accumulated into again (the same gradient tensor, written by a
        new backward) and no `zero_grad()` was called, it warns.

        ## Why is this bad?
        `backward()` adds into `.grad`. Without `zero_grad()` each step uses the sum of all
        past gradients: the effective learning rate grows every step and training diverges
        or stalls.

        ## Example
        ```python
        for x, y in loader:
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        ```

        ## Use instead
        ```python
        for x, y in loader:
            optimizer.zero_grad()
            loss = criterion(model(x), y)
            loss.backward()
            optimizer.step()
        ```
        """,
    ),
)


# Multi-GPU (simulated torchrun) and non-finite-value codes: their docs live in catalog_multigpu.
RUNTIME_RULES += tuple(
    _info(code, name, category, Severity(severity), "runtime", doc)
    for code, name, category, severity, doc in ENTRIES
)


@functools.cache
def catalog() -> dict[str, RuleInfo]:
    """Every known code -> its metadata and docs, sorted by code."""
    entries: dict[str, RuleInfo] = {info.code: info for info in (*ENGINE_RULES, *RUNTIME_RULES)}
    for rule in rule_classes():
        entries[rule.code] = RuleInfo(
            code=rule.code,
            name=rule.name,
            category=rule.category,
            severity=rule.severity,
            fix=rule.fix_availability,
            # advice is opt-in: `--extend-select advice` (or a code) switches it on
            default_enabled=rule.default_enabled and rule.group != "advice",
            doc=rule.doc(),
            kind="static",
            group=rule.group,
        )
    return dict(sorted(entries.items()))


def lookup(code_or_name: str) -> RuleInfo | None:
    """Find a rule by code (`td402` works) or by name (`load-without-map-location`)."""
    key = code_or_name.strip()
    entries = catalog()
    if key.upper() in entries:
        return entries[key.upper()]
    for info in entries.values():
        if info.name == key.lower():
            return info
    return None
