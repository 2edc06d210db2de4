"""Calls of a module class's own methods from other files.

`model = Reader.from_pretrained(path)`, moved with `model.to("cuda")`, then
`model.read(images=batch)` with a loader's CPU batch in predict.py: inside
`Reader.read` (model.py) the registered submodules (`self.encoder`) are where that
model is, and `images` is the CPU batch, so `self.encoder(images)` is a meeting of
model.py, reported there. The caller records the call with its receiver
(`CallSite.receiver`), `project_facts.collect` keeps it as a `CallFact` keyed
`Reader.read`, and the method's seeds (flow_seeds) join what every such call passes;
the receiver's place replaces the assumed place of the registered attributes only when
no call of the method is seen in its own file (`self.read(...)`: the same object, of
a place the facts do not give).
"""

from __future__ import annotations

import dataclasses

from torchdoctor.check.analysis.torch_api import MODULE_OWN_METHODS
from torchdoctor.check.analysis.values import (
    UNKNOWN,
    AnyFunction,
    CallSite,
    Env,
    Kind,
    Place,
    Value,
    _as_parameter,
    join,
    sent_from,
)

# What a method fact carries: what the device rules can meet inside the method.
_SENT = (Kind.MODULE, Kind.LOADER, Kind.DEVICE, Kind.BATCH)


def method_fact_name(site: CallSite, imported: set[str], local: set[str]) -> str | None:
    """`Reader.read` when `site` calls a method of an imported module class on a module."""
    if site.receiver is None or site.receiver.kind is not Kind.MODULE:
        return None
    owner, _, method = site.callee.partition(".")
    if not method or "." in method or method in MODULE_OWN_METHODS:
        return None
    if owner in local or owner not in imported:
        return None
    return site.callee


def portable(value: Value, path: str) -> Value:
    """The part of an argument (or the receiver) worth sending to the method's file."""
    if value.kind not in _SENT or value.assumed:
        return UNKNOWN
    if value.kind is Kind.BATCH and value.place is not Place.CPU:
        return UNKNOWN
    return sent_from(value, path)


def method_seeds(
    project: object, path: str, cls_name: str, func: AnyFunction
) -> tuple[list[Env], Value | None]:
    """The parameter values other files' calls of `cls_name.func` pass, one Env per
    call, and the join of the modules they call it on (None: no such call)."""
    getter = getattr(project, "call_facts_for", None)
    if getter is None or cls_name not in getattr(project, "method_classes", ()):
        return [], None
    facts = getter(f"{cls_name}.{func.name}", path)
    if not facts:
        return [], None
    names = [p.arg for p in [*func.args.posonlyargs, *func.args.args]][1:]
    kwonly = {p.arg for p in func.args.kwonlyargs}
    out: list[Env] = []
    receiver: Value | None = None
    for fact in facts:
        env: Env = {}
        if not fact.opaque:
            for name, value in zip(names, fact.args, strict=False):
                env[name] = _as_parameter(name, value)
            for key, value in fact.keywords:
                if key in names or key in kwonly:
                    env[key] = _as_parameter(key, value)
        out.append(env)
        held = fact.receiver or UNKNOWN
        receiver = held if receiver is None else join(receiver, held)
    return out, receiver


def on_receiver(seeds: Env, self_name: str, receiver: Value | None) -> Env:
    """`seeds` with the registered attributes (`self.encoder`, assumed on the module's
    device) where the module the method is called on is shown to be."""
    if (
        receiver is None
        or receiver.kind is not Kind.MODULE
        or receiver.place is not Place.DEVICE
        or receiver.assumed
    ):
        return seeds
    prefix = self_name + "."
    found = dict(seeds)
    for key, value in seeds.items():
        if not key.startswith(prefix):
            continue
        attr = key[len(prefix) :]
        if not (value.assumed and value.is_input and value.device == f"self.{attr}"):
            continue  # not registered with the module: not moved with it
        found[key] = dataclasses.replace(
            value,
            assumed=False,
            is_input=False,
            device=receiver.device,
            device_line=receiver.device_line,
            maybe=receiver.maybe,
            where=receiver.where,
        )
    return found
