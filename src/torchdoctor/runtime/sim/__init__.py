"""The virtual accelerator: real CPU computation, CUDA's device rules.

Modules: `devices` (tag store, virtual devices), `rules` (CUDA's device rules per
ATen op), `mode` (the dispatch mode), `patches` (Python-level entry points),
`session` (`simulate()` and its records). Naming the culprit is
`torchdoctor.runtime.diagnosis`, shared with the guard and the explainer.

The public names load on first use, so `runtime.diagnosis` can import `devices`
without importing the session (which imports the diagnosis).
"""

from typing import Any

__all__ = [
    "Simulation",
    "VirtualAcceleratorError",
    "VirtualDeviceError",
    "VirtualDeviceTypeError",
    "active",
    "simulate",
]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from torchdoctor.runtime.sim import session

        return getattr(session, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
