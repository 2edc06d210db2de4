"""Lazy access to torch: runtime modules call `require_torch()` instead of importing it."""

from __future__ import annotations

import importlib
from types import ModuleType

from torchdoctor.errors import TorchNotInstalledError


def require_torch(feature: str = "this torchdoctor feature") -> ModuleType:
    """Return the torch module, or raise a one-line TorchNotInstalledError."""
    try:
        return importlib.import_module("torch")
    except ImportError as exc:
        raise TorchNotInstalledError(feature) from exc
