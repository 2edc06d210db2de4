"""What a function of another project file makes and hands back to its caller.

`model = build_model(cfg)` where builders.py's `build_model` ends in
`return model.to(get_device())`: the caller holds a module on the device, though
nothing it passed says so. Such a value names the other file's lines (where it was
built, where it was moved), so it crosses over `carried`: `where` names that file in
messages (`Value.where_line`), and its syntax nodes, which mean nothing in the
caller's file, give way to the caller's call.

Only what does not depend on the arguments is passed back this way (`made_here`):
what the call passes is followed with it (`FileFlow.foreign_function`). A caller
passing nothing informative looks at the other file's text first (`makes`): a
function whose text moves nothing and builds no loader is never parsed for it.
"""

from __future__ import annotations

import ast
import dataclasses
import re

from torchdoctor.check.analysis.values import (
    UNKNOWN,
    AnyFunction,
    Kind,
    Place,
    Value,
    built_loaders,
    informative,
    moved_whatever_given,
    proven_module,
)
from torchdoctor.check.lines import as_lf
from torchdoctor.check.source_text import decode_source

# What a function's text must hold to make such a value: a move, or a loader.
MAKERS = (".to(", ".cuda(", "DataLoader(")

# A top-level `def` (`top_level_defs`: the matches of `DEF_LINE`, a pattern tried at
# every position of the text, found from the line starts that begin with `def`/`async`)
DEF_LINE = r"^(?:async[ \t]+)?def[ \t]+(\w+)[ \t]*\("
_DEF = re.compile(DEF_LINE[1:])
# the next top-level statement (a signature's closing `)` at column 0 is not one): the
# `^[^\s#)]` of a multi-line pattern, found from its line break
_TOPLEVEL = re.compile(r"\n[^\s#)]")


def made_here(value: Value, func: AnyFunction) -> Value:
    """The part of `value`, what `func` returns analysed with its parameters unknown,
    that holds however it is called: loaders with a known place, a tensor or a module
    put on a device none of its parameters names, containers of such (their other
    parts unknown). UNKNOWN if nothing."""
    if built_loaders(value) or moved_whatever_given(value, func):
        return value
    if value.kind is Kind.MODULE:
        return value if proven_module(value) and not _chosen_by_caller(value, func) else UNKNOWN
    if value.kind is not Kind.CONTAINER:
        return UNKNOWN
    items = tuple(made_here(v, func) for v in value.items) if value.items else None
    element = made_here(value.element, func) if value.element is not None else None
    kept = [*(items or ()), *((element,) if element is not None else ())]
    if not any(informative(v) for v in kept):
        return UNKNOWN
    same = all(v == w for v, w in zip(kept, [*(value.items or ()), value.element], strict=False))
    return dataclasses.replace(
        value, items=items, element=element, place=value.place if same else Place.UNKNOWN
    )


def _chosen_by_caller(value: Value, func: AnyFunction) -> bool:
    """Whether the device a module was moved to is one of `func`'s parameters (the
    caller may pass the CPU)."""
    root = re.split(r"[.(\[]", value.device, maxsplit=1)[0].strip()
    params = [*func.args.posonlyargs, *func.args.args, *func.args.kwonlyargs]
    params += [a for a in (func.args.vararg, func.args.kwarg) if a is not None]
    return root in {p.arg for p in params} - {"self"}


def carried(value: Value, where: str, call: ast.AST) -> Value:
    """`value`, made in the file named `where`, as the caller of `call` holds it: its
    lines name that file, its nodes are the caller's call."""
    if value is UNKNOWN:
        return value
    changes: dict[str, object] = {
        "where": value.where or where,
        "optimizer": None,
        "dropped_line": 0,
        "default_of": "",
    }
    if value.source is not None:
        changes["source"] = call
    if value.items:
        changes["items"] = tuple(carried(v, where, call) for v in value.items)
    if value.element is not None:
        changes["element"] = carried(value.element, where, call)
    return dataclasses.replace(value, **changes)  # type: ignore[arg-type]


def makes(disk: dict[str, object], path: str, name: str) -> bool:
    """Whether the file at `path` may give `made_here` a value for `name`: its top-level
    `def name(` holds a maker and a `return` (or returns what such a function of the
    file makes), or the file names it without defining it (a package `__init__`
    re-exporting it). The file's text is read once per run."""
    key = f"makers:{path}"
    found = disk.get(key)
    if not isinstance(found, TextDefs):
        found = disk[key] = TextDefs(_read(path))
    return found.makes(name) if found.defines(name) else found.names(name)


def _read(path: str) -> str:
    try:
        with open(path, "rb") as handle:
            return decode_source(handle.read())
    except (OSError, UnicodeDecodeError, LookupError, ValueError):
        return ""


_CALLED = re.compile(r"\b(\w+)\s*\(")


def top_level_defs(text: str) -> list[re.Match[str]]:
    """The matches `re.finditer(DEF_LINE, text, re.M)` gives (their ends and names: each
    starts at the line start it is tried from, not where the multi-line pattern starts)."""
    starts = [0] if text.startswith(("def", "async")) else []
    for head in ("\ndef", "\nasync"):
        at = text.find(head)
        while at >= 0:
            starts.append(at + 1)
            at = text.find(head, at + 1)
    found = []
    for start in sorted(starts):
        match = _DEF.match(text, start)
        if match is not None:
            found.append(match)
    return found


class TextDefs:
    """The top-level functions of a file's text, judged by their text alone, on request:
    only the ones a caller asks about (and those they call) are looked at."""

    def __init__(self, text: str) -> None:
        self.text = as_lf(text)  # `^` matches after `\n` only
        self._bodies: dict[str, str] | None = None
        self._makes: dict[str, bool] = {}

    def defines(self, name: str) -> bool:
        return name in self._defs()

    def names(self, name: str) -> bool:
        """Whether the text names `name` at all (an import re-exporting it)."""
        self._defs()
        return name in self.text

    def makes(self, name: str) -> bool:
        found = self._makes.get(name)
        if found is None:
            self._makes[name] = False  # a recursive function makes nothing more
            body = self._defs().get(name, "")
            found = "return" in body and (
                any(m in body for m in MAKERS)
                or any(
                    called != name and self.defines(called) and self.makes(called)
                    for called in set(_CALLED.findall(body))
                )
            )
            self._makes[name] = found
        return found

    def _defs(self) -> dict[str, str]:
        if self._bodies is None:
            self._bodies = {}
            text = self.text
            for match in top_level_defs(text):
                # (the search starts after a `(`: the line break is past it)
                end = _TOPLEVEL.search(text, match.end())
                body = text[match.end() : end.start() + 1 if end is not None else len(text)]
                self._bodies.setdefault(match.group(1), body)
            if len(text) > 20_000:
                self.text = ""  # a long module is no re-exporting `__init__`: not kept
        return self._bodies
