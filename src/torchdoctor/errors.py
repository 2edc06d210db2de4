"""Errors torchdoctor raises on bad input: one line of cause, one of fix."""

from __future__ import annotations


class TorchDoctorError(Exception):
    """Base class: a clear cause and, where one exists, the fix."""

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        self.message = message
        self.fix = fix
        super().__init__(message if fix is None else f"{message}\n  fix: {fix}")


class UsageError(TorchDoctorError):
    """Bad command-line arguments or configuration (exit code 2)."""


class ConfigError(UsageError):
    """Invalid `[tool.torchdoctor]` configuration."""


class TorchNotInstalledError(TorchDoctorError, ImportError):
    """A runtime feature was used without torch installed."""

    def __init__(self, feature: str = "this feature") -> None:
        super().__init__(
            f"{feature} needs PyTorch, which is not installed",
            fix="pip install 'torchdoctor[runtime]' (or install torch for your platform)",
        )


class DeviceMismatchError(TorchDoctorError, RuntimeError):
    """Tensors or parameters that must share a device do not; the message names each path."""


class InvalidArgumentError(TorchDoctorError, TypeError, ValueError):
    """A runtime helper got an argument of the wrong type or value."""


class DeviceUnavailableError(TorchDoctorError, RuntimeError):
    """A requested device is unknown, or not usable on this machine."""


class CheckpointError(TorchDoctorError, RuntimeError):
    """A checkpoint cannot be written, read or loaded into the given objects."""


class UnsafeCheckpointError(CheckpointError):
    """`weights_only=True` refused a checkpoint that needs arbitrary unpickling."""


class SimulationUnsupportedError(TorchDoctorError, NotImplementedError):
    """`td.simulate` met something it cannot reproduce on a CPU (CUDA graphs, NCCL, ...)."""
