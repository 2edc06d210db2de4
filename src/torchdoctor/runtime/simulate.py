"""`td.simulate("cuda")`: run unmodified PyTorch code on a virtual accelerator.

The implementation lives in `torchdoctor.runtime.sim`; see its modules.
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
