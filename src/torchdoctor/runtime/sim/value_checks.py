"""Argument checks that PyTorch itself skips while any dispatch mode is active.

`torch.quantile(x, q)` checks that a tensor `q` lies in [0, 1] only outside a
dispatch mode: under the simulator's mode an out-of-range `q` reads past the
sorted values (an IndexError, or a wrong number). A CPU raises `RuntimeError`,
and so does a GPU (its device-side assert), so the simulation checks it first.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import torch

if TYPE_CHECKING:
    from torchdoctor.runtime.sim.patches import Patches

Tensor = torch.Tensor


def install(patches: Patches) -> None:
    """Check `q` of `quantile`/`nanquantile` (functions and tensor methods)."""
    for name in ("quantile", "nanquantile"):
        checked = _checking_q(getattr(torch, name), name)
        patches.patcher.set(torch, name, checked)
        patches.patcher.set(Tensor, name, checked)


def _checking_q(real: Callable[..., Any], name: str) -> Callable[..., Any]:
    def checked(input: Tensor, q: Any, *args: Any, **kwargs: Any) -> Any:
        __tracebackhide__ = True
        if isinstance(q, Tensor) and q.numel() and not bool(((q >= 0) & (q <= 1)).all()):
            raise RuntimeError(f"{name}() q values must be in the range [0, 1]")
        return real(input, q, *args, **kwargs)

    checked.__name__ = checked.__qualname__ = name
    checked.__doc__ = real.__doc__
    return checked
