"""torchdoctor: find, prevent and explain PyTorch mistakes.

`import torchdoctor as td` is cheap and never imports torch; the runtime API
below is loaded on first use, and says clearly when torch is missing.
"""

from __future__ import annotations

import importlib
import sys
import types
from typing import Any

from torchdoctor.errors import (
    ConfigError,
    DeviceMismatchError,
    TorchDoctorError,
    TorchNotInstalledError,
    UsageError,
)

__version__ = "0.1.0"

# public name -> module that defines it (imported lazily)
_LAZY: dict[str, str] = {
    "pick_device": "torchdoctor.runtime.device",
    "to_device": "torchdoctor.runtime.device",
    "device_of": "torchdoctor.runtime.device",
    "device_safe": "torchdoctor.runtime.device",
    "DeviceLoader": "torchdoctor.runtime.loader",
    "save_checkpoint": "torchdoctor.runtime.checkpoint",
    "load_checkpoint": "torchdoctor.runtime.checkpoint",
    "env_report": "torchdoctor.runtime.env",
    "guard": "torchdoctor.runtime.guard",
    "simulate": "torchdoctor.runtime.simulate",
    "explain": "torchdoctor.explain.explainer",
    "Explanation": "torchdoctor.explain.explainer",
    "diagnose": "torchdoctor.explain.hooks",
    "install": "torchdoctor.explain.hooks",
}

__all__ = [
    "ConfigError",
    "DeviceMismatchError",
    "TorchDoctorError",
    "TorchNotInstalledError",
    "UsageError",
    "__version__",
    *_LAZY,
]


class _Package(types.ModuleType):
    """This package's module type: `td.explain` stays the function.

    `torchdoctor.explain` is also a subpackage, and importing it (`td.diagnose` does)
    makes Python set the package attribute `explain` to that module, after which
    `td.explain(...)` would fail. The subpackage stays importable by name
    (`from torchdoctor.explain import kb`).
    """

    def __setattr__(self, name: str, value: Any) -> None:
        if name == "explain" and isinstance(value, types.ModuleType):
            return
        super().__setattr__(name, value)


sys.modules[__name__].__class__ = _Package


def __getattr__(name: str) -> Any:
    module_name = _LAZY.get(name)
    if module_name is None:
        raise AttributeError(f"module 'torchdoctor' has no attribute {name!r}")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == "torch" or (exc.name or "").startswith("torch."):
            raise TorchNotInstalledError(f"torchdoctor.{name}") from exc
        raise
    value = getattr(module, name)
    globals()[name] = value  # later lookups skip __getattr__
    return value


def __dir__() -> list[str]:
    return sorted(__all__)


def load_ipython_extension(ipython: Any) -> None:
    """`%load_ext torchdoctor`: explain exceptions raised in notebook cells."""
    from torchdoctor.explain.hooks import load_ipython_extension as _load

    _load(ipython)
