"""Project facts read from a file's text alone, before any file is parsed.

The project index (`project_facts.build_project`) scans every file of a run with these:
which classes move their data to the device, build a BatchNorm1d, make parameters;
where an NCCL process group starts; which methods a file that zeroes gradients calls;
which CUDA extensions a setup.py builds. Each is a regular-expression scan of one text,
cheap enough for every file; a file whose text cannot hold the fact is not scanned.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from torchdoctor.check.analysis.grad_contexts import mentions_zeroing
from torchdoctor.check.project import class_headers

_BODY_ENDS: dict[int, re.Pattern[str]] = {}


def _body_end(indent: int) -> re.Pattern[str]:
    """The first line indented at most `indent` that is not blank or a comment."""
    found = _BODY_ENDS.get(indent)
    if found is None:
        found = _BODY_ENDS[indent] = re.compile(rf"\n[ \t]{{0,{indent}}}(?=[^\s#])")
    return found


# A class body that moves what it is given: `x = x.to(...)`, `.to(self.device)`: what
# `moves_input` finds (tests/check/test_moves_input.py: the same answer as a search for
# this pattern, which is tried at every word character of the text, 10 times slower)
MOVES_INPUT = r"\b(\w+)\s*=\s*\1\s*\.\s*(?:to|cuda)\(|\.to\(\s*self\.device\b"
_TO_SELF_DEVICE = re.compile(r"\.to\(\s*self\.device\b")
_WORD = re.compile(r"\w")
_DEVICE_WORDS = (".to(", ".cuda(", "device")


def _class_bodies(source: str) -> Iterator[tuple[str, str, str]]:
    """(name, bases' text, body's text) of each class header of `source` with a base
    list (`class X(...)`), line ends made `\n`."""
    text, headers = class_headers(source)
    for indent, end, name, bases in headers:
        if bases is None:
            continue
        body_end = _body_end(indent).search(text, end)
        yield name, bases, text[end : body_end.start() if body_end else len(text)]


def _indent(line: str) -> int:
    return len(line) - len(line.lstrip(" \t"))


def moving_classes(source: str) -> set[str]:
    """Classes that put data on the device themselves.

    A Dataset whose body mentions a device (its batches may arrive on the GPU), or
    any class that moves what it receives (`x = x.to(self.device)` in `forward`).
    """
    found: set[str] = set()
    if not any(w in source for w in _DEVICE_WORDS) or "class" not in source:
        return found
    for name, bases, body in _class_bodies(source):
        if "Dataset" in bases:
            if any(w in body for w in _DEVICE_WORDS):
                found.add(name)
        elif ("to(" in body or "cuda(" in body) and moves_input(body):
            found.add(name)
    return found


def moves_input(text: str) -> bool:
    """Whether `MOVES_INPUT` matches in `text`: `.to(self.device`, or a `to(` / `cuda(`
    after a `.` (blanks around it) ending `name = name` (the same word both sides)."""
    if _TO_SELF_DEVICE.search(text) is not None:
        return True
    for call in ("to(", "cuda("):
        at = text.find(call)
        while at >= 0:
            dot = _skip_blanks(text, at)
            if dot >= 0 and text[dot] == ".":
                end = _skip_blanks(text, dot) + 1
                start = _word_start(text, end)
                equals = _skip_blanks(text, start)
                if start < end and equals >= 0 and text[equals] == "=":
                    left_end = _skip_blanks(text, equals) + 1
                    left = _word_start(text, left_end)
                    if text[left:left_end] == text[start:end]:
                        return True
            at = text.find(call, at + 1)
    return False


def _skip_blanks(text: str, at: int) -> int:
    r"""The offset of the last character before `at` that is not blank (`\s`), or -1."""
    at -= 1
    while at >= 0 and text[at].isspace():
        at -= 1
    return at


def _word_start(text: str, end: int) -> int:
    r"""Where the run of word characters (`\w`) that ends at `end` starts (`end`: none)."""
    while end > 0 and _WORD.match(text, end - 1):
        end -= 1
    return end


# In `__init__`: `self.cuda()`, `self.to("cuda")`, `self.to(torch.device("cuda"))`.
_MOVES_SELF = re.compile(
    r"^([ \t]*)self\s*\.\s*(?:cuda\([^()]*\)"
    r"|to\(\s*(?:torch\.device\(\s*)?[\"']cuda[\w:]*[\"']\s*\)?\s*\))"
    r"[ \t]*(?:#[^\n]*)?$",
    re.MULTILINE,
)
_INIT = re.compile(r"^([ \t]*)def[ \t]+__init__[ \t]*\(", re.MULTILINE)
_GPU_TEST = re.compile(r"[ \t]*if[ \t]+(?:torch\.)?cuda\.is_available\(\)[ \t]*:")


def self_moving_classes(source: str) -> dict[str, bool]:
    """Classes whose `__init__` moves the object itself to the GPU (`self.cuda()`),
    name -> whether on some paths only. A move under `if torch.cuda.is_available():`
    (the init's own test) is one to the target device, like `.to(device)` with
    `device = "cuda" if torch.cuda.is_available() else "cpu"`; under any other test
    (`if use_cuda:`) it is a move on some paths. (Read from the text: the project
    index is built before any file is parsed.)"""
    found: dict[str, bool] = {}
    if "self.cuda(" not in source and "self.to(" not in source:
        return found
    for name, _, body in _class_bodies(source):
        init = _INIT.search(body)
        if init is None or ("self.cuda(" not in body and "self.to(" not in body):
            continue
        init_end = _body_end(len(init.group(1))).search(body, init.end())
        code = body[init.end() : init_end.start() if init_end else len(body)]
        # the body's own indent: the least of its lines (a wrapped signature is deeper)
        own = min((_indent(ln) for ln in code.split("\n")[1:] if ln.strip()), default=0)
        for move in _MOVES_SELF.finditer(code):
            depth = len(move.group(1))
            before = reversed(code[: move.start()].split("\n"))
            test = next((ln for ln in before if ln.strip() and _indent(ln) < depth), "")
            gpu = _GPU_TEST.match(test) is not None and _indent(test) == own
            some_paths = depth != own and not gpu
            found[name] = found.get(name, True) and some_paths
    return found


LOADER_WORDS = ("loader", "Loader", "_dl")


def parameter_classes(source: str) -> set[str]:
    """Classes whose body makes an `nn.Parameter` (`self.b = nn.Parameter(...)`): code
    that builds one may update its parameters in place (TD213 asks)."""
    found: set[str] = set()
    if "Parameter(" not in source or "class" not in source:
        return found
    for name, _, body in _class_bodies(source):
        if "Parameter(" in body:
            found.add(name)
    return found


# What a loss class that takes logits hands its input to (TD301/TD302 follow a call of
# one, `FocalLoss(a, g)(pred, y)`, into its `forward`).
_TAKES_LOGITS_WORDS = ("with_logits", "BCEWithLogitsLoss", "log_softmax", "cross_entropy")


def logit_loss_classes(source: str) -> set[str]:
    """Classes whose body names a loss or activation that takes logits: the candidates
    for a project loss class built on one (the rules read the class to decide)."""
    found: set[str] = set()
    if "class" not in source or not any(w in source for w in _TAKES_LOGITS_WORDS):
        return found
    for name, _, body in _class_bodies(source):
        if any(w in body for w in _TAKES_LOGITS_WORDS):
            found.add(name)
    return found


# `class Meter:`: a class header without bases (`_class_bodies` wants the brackets); found
# from its `class` word, the line start checked after (a pattern that starts with `^` or
# a lookbehind is tried at every position: 7 to 17 times slower on torch's tree)
_PLAIN_CLASS = re.compile(r"class[ \t]+(\w+)[ \t]*:")


def plain_classes(source: str) -> list[str]:
    """The classes `source` defines without a base list."""
    if "class" not in source:
        return []
    found = []
    for match in _PLAIN_CLASS.finditer(source):
        start = match.start()
        line = max(source.rfind("\n", 0, start), source.rfind("\r", 0, start)) + 1
        if not source[line:start].strip(" \t"):
            found.append(match.group(1))
    return found


_BATCHNORM_1D = re.compile(r"\bBatchNorm1d\(")
_CLASS_LINE = re.compile(r"(?:^|(?<=[\r\n]))class\s+(\w+)")
_LINE_END = re.compile(r"\r\n?|\n")
_CALLED = re.compile(r"(?<![.\w])([A-Z]\w*)\(")  # `Net(`, not `torch.Generator(`


def builds_batchnorm1d(source: str) -> bool:
    """The text builds a `BatchNorm1d` layer: one value per channel on (N, C) inputs."""
    return "BatchNorm1d" in source and _BATCHNORM_1D.search(source) is not None


def class_builds(source: str) -> dict[str, tuple[bool, frozenset[str]]]:
    """Top-level class name -> (builds a BatchNorm1d, the capitalized names it calls),
    each class's text taken up to the next top-level class; only for a text that builds
    a BatchNorm1d (the others cannot start a chain, and scanning every class of a large
    tree would cost a tenth of parsing it)."""
    if not builds_batchnorm1d(source):
        return {}
    heads = list(_CLASS_LINE.finditer(source))
    found = {}
    for i, head in enumerate(heads):
        body = source[head.end() : heads[i + 1].start() if i + 1 < len(heads) else None]
        found[head.group(1)] = (builds_batchnorm1d(body), frozenset(_CALLED.findall(body)))
    return found


def batchnorm_classes(
    classes: dict[str, list[tuple[bool, frozenset[str]]]],
    definitions: dict[str, int],
) -> frozenset[str]:
    """Class names every definition of which builds a BatchNorm1d, or builds (by name) a
    class that does, among the classes of the files that build one (`class_builds`). A
    name defined more than once in the project (a `Generator` in each of two scripts)
    counts only if all its definitions do: which one a file means is unknown."""
    known = {name: facts for name, facts in classes.items() if len(facts) == definitions.get(name)}
    found: set[str] = set()
    changed = True
    while changed:
        changed = False
        for name, facts in known.items():
            if name not in found and all(
                builds or not calls.isdisjoint(found) for builds, calls in facts
            ):
                found.add(name)
                changed = True
    return frozenset(found)


# `init_process_group("nccl")`, `(backend="nccl" if cuda else "gloo")`, over lines.
_NCCL_START = re.compile(r"init_process_group\((?:[^()]|\([^()]*\))*?[\"']nccl[\"']")


def nccl_start(path: str, source: str) -> str | None:
    """Where (`path:line`) `source` starts an NCCL process group, if it does."""
    if "nccl" not in source:
        return None
    match = _NCCL_START.search(source)
    if match is None:
        return None
    return f"{path}:{len(_LINE_END.findall(source, 0, match.start())) + 1}"


# any start of a process group (not a definition of a function of that name)
_GROUP_START = re.compile(r"(?<!def )\binit_process_group\(")


def starts_other_group(source: str) -> bool:
    """Whether `source` starts a process group and never one spelled `"nccl"` (only
    `"gloo"`, or `backend=args.backend`): a program of the project may run without NCCL.
    (A file that starts NCCL and `"gloo"` otherwise picks NCCL on GPU machines.)"""
    if "init_process_group(" not in source or _GROUP_START.search(source) is None:
        return False
    return _NCCL_START.search(source) is None


_METHOD_CALL = re.compile(r"\.(\w+)\s*\(")


def zeroing_calls(source: str) -> frozenset[str] | None:
    """The method names a file calls, if it zeroes gradients somewhere (else None)."""
    if not mentions_zeroing(source):
        return None
    return frozenset(_METHOD_CALL.findall(source))


# `CUDAExtension("pkg._ext", [...])` or `CUDAExtension(name="ops", ...)` in a setup.py
_CUDA_EXTENSION = re.compile(r"CUDAExtension\(\s*(?:name\s*=\s*)?[\"']([\w.]+)[\"']")


def cuda_extensions(source: str) -> set[str]:
    """The extension modules `source` builds with torch's `CUDAExtension` (dotted names;
    a relative import matches the last part)."""
    if "CUDAExtension(" not in source:
        return set()
    return set(_CUDA_EXTENSION.findall(source))
