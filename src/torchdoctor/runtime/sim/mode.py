"""The dispatch mode that applies CUDA's device rules to every ATen call.

Every op runs for real on the CPU. The mode only reads the virtual device of
each tensor operand (one attribute lookup on its storage), takes a fast path
when they all agree, and otherwise asks `rules.check` what CUDA would do.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from torchdoctor.runtime.sim import rules
from torchdoctor.runtime.sim.devices import TAG, WILD, set_tag, tag_of

if TYPE_CHECKING:
    from torchdoctor.runtime.sim.session import Simulation

Tensor = torch.Tensor
_UNSET: Any = object()


class SimulatedError(Exception):
    """Mixin of the errors the simulation raises in PyTorch's name."""

    def __reduce__(self) -> Any:
        # pickled (multiprocessing) as the PyTorch type it stands for
        shown = next(c for c in type(self).__mro__[1:] if not issubclass(c, SimulatedError))
        return (shown, self.args)


def _tag_outputs(out: Any, dev: Any) -> None:
    try:
        if isinstance(out, Tensor):
            storage = out.untyped_storage()
            if getattr(storage, TAG, None) is not dev:
                setattr(storage, TAG, dev)
        elif out.__class__ is tuple or out.__class__ is list:
            for item in out:
                if isinstance(item, Tensor):
                    storage = item.untyped_storage()
                    if getattr(storage, TAG, None) is not dev:
                        setattr(storage, TAG, dev)
    except (RuntimeError, NotImplementedError, TypeError, ValueError):
        # sparse outputs keep the tag on their values; nested ones are not tracked
        for item in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(item, Tensor):
                set_tag(item, dev)


class VirtualDeviceMode(TorchDispatchMode):  # type: ignore[misc]
    """Tags outputs with their virtual device and raises what CUDA would raise."""

    def __init__(self, session: Simulation) -> None:
        super().__init__()  # type: ignore[no-untyped-call]
        self.session = session
        self.key = session.devices.backend.upper()  # CUDA: as in wrapper_CUDA_addmm
        self.no_float64 = session.devices.backend == "mps"  # MPS has no float64

        aten = torch.ops.aten
        # ops whose outputs do not all follow the common device: packed sequences
        # (rule 9), and set_(storage), whose output takes the storage it is given
        self.pack_ops = frozenset(
            {aten._pack_padded_sequence.default, aten._pad_packed_sequence.default}
        )
        set_overloads = aten.set_.overloads()  # type: ignore[no-untyped-call]
        self.slow_ops = self.pack_ops | {getattr(aten.set_, n) for n in set_overloads}

        self._alias: dict[Any, tuple[bool, ...]] = {}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # The default wraps __torch_dispatch__ in torch._disable_dynamo, which costs a
        # few microseconds on every op; the session handles torch.compile itself.
        return False

    def __torch_dispatch__(
        self,
        func: Any,
        types: Any,
        args: tuple[Any, ...] = (),
        kwargs: dict[str, Any] | None = None,
        _Tensor: Any = Tensor,  # locals: faster than globals on this hot path
        _TAG: str = TAG,
        _list: Any = list,
        _tuple: Any = tuple,
    ) -> Any:
        if kwargs is None:
            kwargs = {}
        # Fast path: read each operand's tag once; stop at the first disagreement.
        dev = _UNSET
        mixed = False
        try:
            for a in args:
                if isinstance(a, _Tensor):
                    d = getattr(a.untyped_storage(), _TAG, None)
                    if dev is _UNSET:
                        dev = d
                    elif d is not dev:
                        mixed = True
                        break
                elif a.__class__ is _list or a.__class__ is _tuple:
                    for b in a:
                        if isinstance(b, _Tensor):
                            d = getattr(b.untyped_storage(), _TAG, None)
                            if dev is _UNSET:
                                dev = d
                            elif d is not dev:
                                mixed = True
                                break
                    if mixed:
                        break
            if kwargs and not mixed:
                for a in kwargs.values():
                    if isinstance(a, _Tensor):
                        d = getattr(a.untyped_storage(), _TAG, None)
                        if dev is _UNSET:
                            dev = d
                        elif d is not dev:
                            mixed = True
                            break
        except (RuntimeError, NotImplementedError, TypeError, ValueError):
            mixed = True  # an operand without a storage (sparse, nested)
        if mixed:
            try:
                return self._slow(func, args, kwargs)
            except SimulatedError as error:
                # raise from here: the traceback ends at the op, not inside torchdoctor
                __tracebackhide__ = True  # pytest hides this frame
                raise error.with_traceback(None) from None

        if dev is _UNSET:
            # No tensor operand: a factory. Called from Python, it went through our
            # patched factory, which retags it; called from inside a C++ composite,
            # it belongs to that composite's input: wild.
            out = func._op(*args, **kwargs)
            if isinstance(out, _Tensor):
                _tag_outputs(out, WILD)
            return out
        if func in self.slow_ops:
            return self._slow(func, args, kwargs)
        out = func._op(*args, **kwargs)  # the OpOverload's C++ callable: one frame less
        if dev is not None:
            if self.no_float64 and isinstance(out, _Tensor) and out.dtype is torch.float64:
                try:
                    self.session.mps_float64(out)
                except SimulatedError as error:
                    __tracebackhide__ = True
                    raise error.with_traceback(None) from None
            if isinstance(out, _Tensor):
                try:
                    storage = out.untyped_storage()
                    if getattr(storage, _TAG, None) is not dev:
                        setattr(storage, _TAG, dev)
                except (RuntimeError, NotImplementedError, TypeError, ValueError):
                    _tag_outputs(out, dev)
            else:
                _tag_outputs(out, dev)
        return out

    def _slow(self, func: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        violation = None
        try:
            out_dev, _ = rules.check(
                func, args, kwargs, tag_of, set_tag, self.key, self.session.lenient > 0
            )
        except rules.Violation as broken:
            violation = broken
        if violation is not None:  # outside the except block: no chained traceback
            out_dev = self.session.violation(violation, op=func)
        out = func(*args, **kwargs)
        if func in self.pack_ops:  # (data, batch_sizes/lengths): the second stays on the CPU
            _tag_outputs(out[0], out_dev)
            set_tag(out[1], None)
            return out
        if isinstance(out_dev, rules.PerPosition):  # _foreach_*: each position its own device
            if isinstance(out, (list, tuple)):
                for item, dev in zip(out, out_dev, strict=False):
                    if dev is not None:
                        _tag_outputs(item, dev)
            return out
        self._tag_new_outputs(func, out, out_dev)
        return out

    def _tag_new_outputs(self, func: Any, out: Any, dev: Any) -> None:
        """Tag outputs that are new tensors; in-place results and views keep their tag."""
        if dev is None:
            return
        aliased = self._alias.get(func)
        if aliased is None:
            aliased = tuple(r.alias_info is not None for r in func._schema.returns)
            self._alias[func] = aliased
        if isinstance(out, Tensor):
            if not (aliased and aliased[0]):
                _tag_outputs(out, dev)
        elif isinstance(out, (tuple, list)):
            one_list = len(aliased) == 1  # a single Tensor[] return: split, unbind, ...
            for i, item in enumerate(out):
                if aliased[0] if one_list else i < len(aliased) and aliased[i]:
                    continue
                _tag_outputs(item, dev)
