"""Putting the states of a checkpoint back into the objects they were saved from.

Models get their `module.` / `_orig_mod.` prefixes reconciled and key mismatches listed
by subtree; optimizers move their state to each parameter's device; anything else with
`load_state_dict` (schedulers, GradScaler, samplers, ...) gets its entry back by name.
"""

from __future__ import annotations

import collections
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import torch
from torch import nn

from torchdoctor.errors import CheckpointError


def unwrap_module(module: nn.Module) -> nn.Module:
    """The user's model inside DataParallel / DistributedDataParallel / torch.compile."""
    while True:
        if isinstance(module, (nn.DataParallel, nn.parallel.DistributedDataParallel)):
            inner = module.module
        else:
            inner = getattr(module, "_orig_mod", None)  # torch.compile's OptimizedModule
        if not isinstance(inner, nn.Module):
            return module
        module = inner


WRAPPER_PREFIXES = ("module.", "_orig_mod.")


def pick_entry(
    data: Mapping[str, Any],
    kinds: Mapping[str, str],
    kind: str,
    names: Iterable[str],
    taken: Iterable[str] = (),
) -> tuple[str, Any] | None:
    """The entry holding a model's (or optimizer's) state, or None when there is none.

    `taken` are entries the caller restores by name: never a candidate here.
    """
    skip = set(taken)
    candidates = [name for name, k in kinds.items() if k == kind and name not in skip]
    for name in (n for n in names if n not in skip):
        value = data.get(name)
        if kinds and name in candidates:
            return name, value
        if not kinds and isinstance(value, (Mapping, nn.Module)):
            return name, value
    if len(candidates) == 1:
        return candidates[0], data[candidates[0]]
    if len(candidates) > 1:
        raise CheckpointError(
            f"the checkpoint holds several {kind}s ({', '.join(candidates)}); "
            "load_checkpoint cannot tell which one you mean",
            fix="pass each by the name it was saved under: td.load_checkpoint(path, "
            + ", ".join(f"{name}=..." for name in candidates)
            + ")",
        )
    return None


def looks_like_state_dict(data: Mapping[Any, Any]) -> bool:
    return bool(data) and all(isinstance(v, torch.Tensor) for v in data.values())


def _rename_keys(state: Mapping[str, Any], rename: Any) -> collections.OrderedDict[str, Any]:
    renamed: collections.OrderedDict[str, Any] = collections.OrderedDict(
        (rename(k), v) for k, v in state.items()
    )
    metadata = getattr(state, "_metadata", None)
    if isinstance(metadata, dict):  # module versions, keyed by module prefix
        renamed._metadata = {  # type: ignore[attr-defined]
            rename(k + ".")[:-1] if k else k: v for k, v in metadata.items()
        }
    return renamed


def adapt_prefixes(state: Mapping[str, Any], model_keys: Iterable[str]) -> Mapping[str, Any]:
    """Strip or add `module.` / `_orig_mod.` so the checkpoint keys match the model's."""
    wanted = set(model_keys)
    for _ in range(4):  # wrappers can nest: _orig_mod.module.layer...
        keys = list(state)
        if not keys or not wanted or set(keys) == wanted:
            return state
        for prefix in WRAPPER_PREFIXES:
            ckpt_has = all(k.startswith(prefix) for k in keys)
            model_has = all(k.startswith(prefix) for k in wanted)
            if ckpt_has and not model_has:
                state = _rename_keys(
                    state, lambda k, p=prefix: k[len(p) :] if k.startswith(p) else k
                )
                break
            if model_has and not ckpt_has:
                state = _rename_keys(state, lambda k, p=prefix: p + k)
                break
        else:
            return state
    return state


def group_keys(subset: Iterable[str], universe: Iterable[str], limit: int = 12) -> str:
    """`encoder.layers.3.* (4 keys), head.weight`: whole subtrees collapsed to one line."""
    chosen = set(subset)
    total: collections.Counter[str] = collections.Counter()
    inside: collections.Counter[str] = collections.Counter()
    for key in set(universe) | chosen:
        parts = key.split(".")
        for depth in range(1, len(parts)):
            prefix = ".".join(parts[:depth])
            total[prefix] += 1
            if key in chosen:
                inside[prefix] += 1
    groups: dict[str, int] = {}
    for key in sorted(chosen):
        parts = key.split(".")
        label, count = key, 1
        for depth in range(1, len(parts)):
            prefix = ".".join(parts[:depth])
            if total[prefix] == inside[prefix] and inside[prefix] > 1:
                label, count = prefix + ".*", inside[prefix]
                break
        groups[label] = count
    shown = [f"{label} ({n} keys)" if n > 1 else label for label, n in groups.items()]
    if len(shown) > limit:
        shown = [*shown[:limit], f"... {len(shown) - limit} more"]
    return ", ".join(shown)


def _on_meta(module: nn.Module) -> bool:
    return any(t.is_meta for t in (*module.parameters(), *module.buffers()))


def load_model_state(model: nn.Module, state: Any, strict: bool, path: Path) -> None:
    """Load `state` into `model`; a model built on the meta device gets the tensors assigned."""
    target = unwrap_module(model)
    if isinstance(state, nn.Module):  # a whole pickled model (weights_only=False)
        state = unwrap_module(state).state_dict()
    if not isinstance(state, Mapping):
        raise CheckpointError(
            f"the model entry of {path} is a {type(state).__name__}, not a state dict"
        )
    model_keys = list(target.state_dict())
    state = adapt_prefixes(state, model_keys)
    try:
        # copying into meta tensors keeps no data: take the loaded tensors themselves
        result = target.load_state_dict(state, strict=False, assign=_on_meta(target))
    except RuntimeError as exc:  # size mismatches are raised even with strict=False
        details = "; ".join(
            line.strip() for line in str(exc).splitlines()[1:] if line.strip()
        ) or str(exc)
        raise CheckpointError(
            f"{path} does not fit {type(target).__name__}: {details}",
            fix="build the model with the same configuration as the one that was saved",
        ) from exc
    if strict and (result.missing_keys or result.unexpected_keys):
        problems = []
        if result.missing_keys:
            problems.append(
                "the model has keys the checkpoint lacks: "
                + group_keys(result.missing_keys, model_keys)
            )
        if result.unexpected_keys:
            problems.append(
                "the checkpoint has keys the model lacks: "
                + group_keys(result.unexpected_keys, list(state))
            )
        raise CheckpointError(
            f"{path} does not match {type(target).__name__}. " + ". ".join(problems),
            fix="build the same architecture that was saved, or pass strict=False to load "
            "the keys that match",
        )


def load_optimizer_state(optimizer: Any, state: Any, path: Path) -> None:
    try:
        # Optimizer.load_state_dict moves the state to each parameter's device and dtype.
        optimizer.load_state_dict(state)
    except (ValueError, KeyError, TypeError, RuntimeError) as exc:
        raise CheckpointError(
            f"the optimizer state in {path} does not fit this optimizer: {exc}",
            fix="build the optimizer over the same parameters (and groups) as when saving",
        ) from exc


def load_object_state(obj: Any, name: str, state: Any, strict: bool, path: Path) -> None:
    """Restore one object passed by the name it was saved under."""
    if isinstance(obj, nn.Module):
        load_model_state(obj, state, strict, path)
    elif isinstance(obj, torch.optim.Optimizer):
        load_optimizer_state(obj, state, path)
    else:
        try:
            _check_same_kind(obj, state)
            obj.load_state_dict(state)
        except Exception as exc:  # schedulers, scalers, samplers raise all kinds
            raise CheckpointError(
                f"the {name!r} state in {path} does not fit this {type(obj).__name__}: "
                f"{type(exc).__name__}: {exc}",
                fix=f"build the {type(obj).__name__} as it was when saved (same optimizer, "
                "same settings), or leave it out of load_checkpoint",
            ) from exc


def _check_same_kind(obj: Any, state: Any) -> None:
    """Refuse a state that shares no key with the object's own (another object's entry).

    Schedulers load any dict without complaint (`__dict__.update`), so a wrong entry would
    be restored silently. Keys added or dropped between torch versions still overlap.
    """
    own = obj.state_dict()
    comparable = isinstance(own, Mapping) and isinstance(state, Mapping) and own and state
    if comparable and not set(own) & set(state):
        raise ValueError(
            f"the saved keys ({', '.join(map(str, list(state)[:6]))}) share none with "
            f"its own ({', '.join(map(str, list(own)[:6]))})"
        )
