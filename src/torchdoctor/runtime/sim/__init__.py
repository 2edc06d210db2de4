"""The virtual accelerator: real CPU computation, CUDA's device rules.

Modules: `devices` (tag store, virtual devices), `rules` (CUDA's device rules per
ATen op), `mode` (the dispatch mode), `patches` (Python-level entry points),
`diagnose` (naming the culprit), `session` (`simulate()` and its records).
"""

from torchdoctor.runtime.sim.session import (
    Simulation,
    VirtualAcceleratorError,
    VirtualDeviceError,
    VirtualDeviceTypeError,
    active,
    simulate,
)

__all__ = [
    "Simulation",
    "VirtualAcceleratorError",
    "VirtualDeviceError",
    "VirtualDeviceTypeError",
    "active",
    "simulate",
]
