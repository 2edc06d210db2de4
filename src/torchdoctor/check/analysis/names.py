"""What names say: evaluation, models, optimizers, test files (word heuristics)."""

from __future__ import annotations

import ast
import re
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.syntax import last_part, words

if TYPE_CHECKING:
    pass


FuncNode = ast.FunctionDef | ast.AsyncFunctionDef


LoopNode = ast.For | ast.AsyncFor | ast.While


EVAL_WORDS = frozenset(
    {
        "eval",
        "evaluate",
        "evaluation",
        "evaluator",
        "validate",
        "validation",
        "val",
        "valid",
        "test",
        "testing",
        "predict",
        "prediction",
        "inference",
        "infer",
        "generate",
    }
)


_GENERATION_WORDS = frozenset(
    {
        "generate",
        "text",
        "tokens",
        "sequence",
        "sequences",
        "samples",
        "images",
        "caption",
        "captions",
        "response",
        "responses",
        "answer",
        "output",
        "outputs",
        "and",
        "print",
        "sample",
        "simple",
        "batch",
        "greedy",
        "beam",
        "search",
    }
)


_EVAL_DATA_WORDS = frozenset({"val", "valid", "validation", "test", "testing", "eval", "dev"})


_NOT_EVAL_WORDS = frozenset(
    {
        "train",
        "training",
        "fit",
        "loss",
        "split",
        "set",
        "is",
        "get",
        "build",
        "make",
        "create",
        "loader",
        "dataloader",
        "dataset",
        "datasets",
        "transform",
        "transforms",
    }
)


# Lightning sets eval mode and no_grad around these itself.
_LIGHTNING_EVAL_HOOK = re.compile(
    r"^(?:(?:validation|valid|val|test|predict|inference|eval)_(?:step|step_end|epoch_end)"
    r"|on_(?:validation|test|predict)_\w+)$"
)


def is_lightning_eval_hook(name: str) -> bool:
    """`validation_step`, `test_step`, `predict_step` (Lightning), `valid_step` (fairseq)...:
    the framework sets eval mode and no_grad around these hooks itself."""
    return bool(_LIGHTNING_EVAL_HOOK.match(name))


def is_eval_name(name: str) -> bool:
    """evaluate, validate, run_validation, test_epoch, predict, generate -- not test_foo."""
    ws = words(name)
    if not ws or is_lightning_eval_hook(name):
        return False
    if any(w in _NOT_EVAL_WORDS for w in ws):
        return False
    if ws[0] == "test" and len(ws) > 1 and ws[1] not in ("epoch", "step", "loop", "one"):
        return False  # unit tests: test_conv_eval, testForward
    if "generate" in ws and not set(ws) <= _GENERATION_WORDS:
        return False  # generate_inputs, generate_config: not model inference
    return any(w in EVAL_WORDS for w in ws)


_TORCH_HINTS = ("torch", "lightning", "accelerate", ".backward(", ".eval()", "no_grad")


def is_torch_file(source: str) -> bool:
    """Code that may train or evaluate a PyTorch model (not the stdlib, not NumPy code)."""
    return any(hint in source for hint in _TORCH_HINTS)


# Pieces of identifiers that may be eval-ish / model-ish (lowercase): every word of
# EVAL_WORDS and _EVAL_DATA_WORDS contains one of the first, and every name _MODELISH
# matches (but G and D) one of the second -- a cheap prefilter, so the word tests run on
# few names
_EVALISH_PIECES = ("val", "test", "predict", "infer", "generate", "dev", "no_grad")


_MODELISH_PIECES = (
    "model",
    "net",
    "classifier",
    "coder",
    "generator",
    "discriminator",
    "critic",
    "actor",
    "backbone",
    "teacher",
    "student",
)


def _lines_with(pieces: tuple[str, ...], lines: str) -> set[str]:
    """The lines of `lines` (one identifier each) that contain one of `pieces` in any
    case: `str.find` on the lowered text, each hit widened to its line."""
    lowered = lines.lower()
    if len(lowered) != len(lines):  # a non-ASCII letter whose lower case is longer
        return {w for w in lines.split("\n") if any(p in w.lower() for p in pieces)}
    found: set[str] = set()
    for piece in pieces:
        at = lowered.find(piece)
        while at >= 0:
            start = lowered.rfind("\n", 0, at) + 1
            end = lowered.find("\n", at)
            if end < 0:
                end = len(lowered)
            found.add(lines[start:end])
            at = lowered.find(piece, end)
    return found


_EVALISH: dict[str, bool] = {}


_MODELISH_WORDS: dict[str, bool] = {}


def _modelish_word(word: str) -> bool:
    found = _MODELISH_WORDS.get(word)
    if found is None:
        found = is_modelish_name(word)
        if len(_MODELISH_WORDS) < 100_000:
            _MODELISH_WORDS[word] = found
    return found


def _evalish_identifier(name: str) -> bool:
    found = _EVALISH.get(name)
    if found is None:
        found = is_eval_name(name) or is_eval_iterable(name)
        if len(_EVALISH) < 100_000:
            _EVALISH[name] = found
    return found


def is_test_file(path: str) -> bool:
    """Unit tests (`test_x.py`, `x_test.py`, `conftest.py`): not training code."""
    base = path.replace("\\", "/").rsplit("/", 1)[-1]
    return base.startswith("test_") or base.endswith("_test.py") or base == "conftest.py"


def is_test_code(path: str) -> bool:
    """A unit test, or a file of a test folder: not where the project runs its models."""
    parts = path.replace("\\", "/").split("/")
    return is_test_file(path) or any(p in ("tests", "test", "testing") for p in parts[:-1])


def is_eval_iterable(text: str) -> bool:
    """`val_loader`, `tqdm(test_dataloader)`, `data_loader_val` -- not `train_loader`."""
    ws = words(text)
    return any(w in _EVAL_DATA_WORDS for w in ws) and not any(
        w in ("train", "training") for w in ws
    )


_MODELISH = re.compile(
    # single letters only as GAN code spells them (G, D): `d` and `g` are dicts and graphs
    r"^(?:(?-i:[GD])|net[A-Z_]\w*|model_\w+|\w*model|\w*net|network|classifier|encoder"
    r"|decoder|generator|discriminator|critic|actor|backbone|teacher|student)$",
    re.I,
)


_NOT_A_MODEL_PREFIX = re.compile(r"^(?:d|n|num|dim|size|len|is|has|use|max|min)_", re.I)


_NOT_MODEL = re.compile(r"loss|criterion|metric|optim|sched|scaler|accelerator|fabric", re.I)


def is_modelish_name(key: str) -> bool:
    """`model`, `net`, `resnet`, `policy_net`, `netG`, `self.encoder` -- not `writer.generator`."""
    parts = key.split(".")
    if len(parts) > 1 and parts[0] != "self" and not _MODELISH.match(parts[0]):
        return False
    last = parts[-1]
    if _NOT_A_MODEL_PREFIX.match(last):
        return False  # d_model, num_models, use_model: sizes and flags
    return bool(_MODELISH.match(last)) and not _NOT_MODEL.search(last)


_VERB = re.compile(
    r"(?:get|build|create|make|load|unwrap|init|setup|prepare|forward|run|compute|to|from|"
    r"convert|export|wrap|apply|update|set|reset|register|fuse|save|train|eval)(?:_|$)",
    re.I,
)


_OPTIMIZERISH = re.compile(r"optim|^opt(?:$|[_A-Z0-9])|_opt(?:$|[_A-Z0-9])", re.I)


def is_optimizerish(key: str) -> bool:
    last = last_part(key)
    return bool(_OPTIMIZERISH.search(last)) and "sched" not in last.lower()


def is_scalerish(key: str) -> bool:
    return "scaler" in last_part(key).lower()
