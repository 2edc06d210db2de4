"""`td.simulate("cuda")`: one simulation, its errors and its keep-going record."""

from __future__ import annotations

import contextlib
import copyreg
import importlib.abc
import importlib.machinery
import os
import sys
import threading
from collections.abc import Iterator
from types import TracebackType
from typing import IO, Any

import torch
from torch.utils._python_dispatch import _pop_mode, _push_mode

from torchdoctor.errors import SimulationUnsupportedError, UsageError
from torchdoctor.explain.frames import hide_own_frames
from torchdoctor.runtime.diagnosis import Diagnosis, diagnose_violation
from torchdoctor.runtime.sim.devices import WILD, VirtualDevices, set_tag
from torchdoctor.runtime.sim.distributed import DistributedLayer
from torchdoctor.runtime.sim.mode import SimulatedError, VirtualDeviceMode
from torchdoctor.runtime.sim.patches import Patches
from torchdoctor.runtime.sim.ranks import write_record
from torchdoctor.runtime.sim.rules import CPU_BY_DESIGN, Violation

BACKENDS = ("cuda", "mps")


class _ShownAsTorch(type):
    """Metaclass of the simulated errors: they print under PyTorch's own type names."""


class VirtualDeviceError(SimulatedError, RuntimeError, metaclass=_ShownAsTorch):
    """What PyTorch raises on a GPU machine (same message); `.diagnosis` names the culprit."""

    diagnosis: Diagnosis


class VirtualDeviceTypeError(SimulatedError, TypeError, metaclass=_ShownAsTorch):
    """PyTorch's TypeError for device tensors (`.numpy()` on cuda); `.diagnosis` attached."""

    diagnosis: Diagnosis


class VirtualAcceleratorError(  # type: ignore[misc]
    SimulatedError, torch.AcceleratorError, metaclass=_ShownAsTorch
):
    """CUDA's own errors (invalid device ordinal); `.diagnosis` attached."""

    diagnosis: Diagnosis


_ERROR_TYPES: dict[type[BaseException], type[BaseException]] = {
    RuntimeError: VirtualDeviceError,
    TypeError: VirtualDeviceTypeError,
    torch.AcceleratorError: VirtualAcceleratorError,
}

# Tracebacks print these under PyTorch's names (RuntimeError, torch.AcceleratorError), as
# a GPU machine would; `except td.VirtualDeviceError` and `except RuntimeError` both work.
_BY_SHOWN_NAME = {shown.__qualname__: error for shown, error in _ERROR_TYPES.items()}
for _shown, _error in _ERROR_TYPES.items():
    _error.__module__ = _shown.__module__
    _error.__qualname__ = _error.__name__ = _shown.__qualname__


def _error_class(shown_name: str) -> type[BaseException]:
    return _BY_SHOWN_NAME[shown_name]


# Pickled by reference (a DataLoader worker sends the class of its error to the parent):
# the shown name is PyTorch's, so the class is found again through this module.
copyreg.pickle(_ShownAsTorch, lambda cls: (_error_class, (cls.__qualname__,)))  # type: ignore[arg-type, return-value]


INVALID_ORDINAL = (
    "CUDA error: invalid device ordinal\n"
    "CUDA kernel errors might be asynchronously reported at any other API call, so the "
    "stacktrace below might be incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n"
)


def _skip_in_dynamo() -> None:
    """torch.compile must run the dispatch mode, not trace into it (no per-op cost)."""
    try:
        from torch._dynamo.eval_frame import skip_code
    except ImportError:  # another torch: the mode is simply traced or skipped there
        return
    for function in (VirtualDeviceMode.__torch_dispatch__, VirtualDeviceMode._slow):
        skip_code(function.__code__)


def _add_note(error: BaseException, note: str) -> None:
    """error.add_note (Python 3.11+); on 3.10 the note is kept in __notes__ unprinted."""
    add_note = getattr(error, "add_note", None)
    if add_note is not None:
        add_note(note)
    else:
        error.__notes__ = [*getattr(error, "__notes__", []), note]  # type: ignore[attr-defined]


def _heal(violation: Violation, diagnosis: Diagnosis) -> Any:
    """Keep-going: move the stray operand to the GPU side, as the fix would.

    Without it one mistake repeats at every later use, and its backward fails
    again on the saved CPU tensors. What moves is the named tensor (a module's
    attribute, a local variable); a view of a larger storage (a slice of the whole
    dataset) is left alone, since retagging it would move the whole dataset.
    Returns the device the call's outputs take.
    """
    if violation.kind not in ("mismatch", "index"):
        return violation.output_device
    named = {c.role: c.value for c in diagnosis.operands}
    pairs = [("reference", violation.reference), ("culprit", violation.culprit)]
    pairs += [("", op) for op in violation.operands]
    devices = [op.device for _, op in pairs if op is not None]
    target = next((d for d in devices if d is not None and d is not WILD), None)
    if target is None:
        return violation.output_device
    for role, op in pairs:
        if op is None or op.device is WILD or op.device == target or op.name in CPU_BY_DESIGN:
            continue
        if op.device is None and op.tensor.dim() == 0 and not op.is_output:
            continue  # a CPU scalar: allowed beside GPU tensors where it matters
        for t in (named.get(role), op.tensor):
            if isinstance(t, torch.Tensor) and _owns_storage(t):
                set_tag(t, target)
                break
    return target


def _owns_storage(t: torch.Tensor) -> bool:
    nbytes = t.untyped_storage().nbytes()
    return t.storage_offset() == 0 and nbytes == t.numel() * t.element_size()


class _DynamoImport(importlib.abc.MetaPathFinder):
    """Imports torch._dynamo with the patches paused, the first time the program does.

    Dynamo indexes torch's functions by identity when it is imported: it must see the
    real ones, not our stand-ins. Importing it up front would cost every run a second.
    """

    def __init__(self, session: Simulation) -> None:
        self.session = session

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> Any:
        if name != "torch._dynamo":
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or spec.loader is None:
            return None
        real_exec = spec.loader.exec_module  # type: ignore[union-attr]
        session = self.session

        def exec_module(module: Any) -> None:
            with session.patches_paused():
                real_exec(module)
            _skip_in_dynamo()

        spec.loader.exec_module = exec_module  # type: ignore[method-assign, union-attr]
        return spec


_active: Simulation | None = None

_lock = threading.Lock()


def active() -> Simulation | None:
    """The running simulation, if any."""
    return _active


class Simulation:
    """A virtual accelerator on this CPU machine; use as a context manager.

    Inside, `torch.cuda.is_available()` is True and every tensor carries the device
    it would have on a GPU machine, so device bugs fail as they would there, with
    PyTorch's own message plus a diagnosis. With `keep_going=True` each distinct
    error is recorded (`errors`) and the program goes on.
    """

    def __init__(
        self,
        device: str = "cuda",
        *,
        devices: int = 1,
        keep_going: bool = False,
        strict_load: bool = False,
        cpu_autocast: bool = False,
        report: IO[str] | None = None,
    ) -> None:
        backend = str(device).split(":", 1)[0]
        if backend not in BACKENDS:
            raise UsageError(
                f"cannot simulate {device!r}: the virtual accelerator simulates "
                f"{' or '.join(BACKENDS)}",
                fix="td.simulate('cuda') or td.simulate('mps')",
            )
        if not isinstance(devices, int) or isinstance(devices, bool) or devices < 1:
            raise UsageError(f"devices must be a positive integer, got {devices!r}")
        if backend == "mps" and devices != 1:
            raise UsageError("mps has exactly one device", fix="leave devices at 1 for mps")
        self.backend = backend
        self.count = devices
        self.keep_going = keep_going
        self.strict_load = strict_load
        self.cpu_autocast = cpu_autocast
        self.report = report
        self.devices = VirtualDevices(backend, devices)
        self.records: dict[tuple[Any, ...], list[Any]] = {}  # key -> [Diagnosis, count]
        self._patches: Patches | None = None
        self.distributed: DistributedLayer | None = None
        self._mode: VirtualDeviceMode | None = None
        self._thread: int | None = None
        self.lenient = 0  # > 0 inside composites that allocate unseen CPU tensors
        self.moves = 0  # tensors copied between devices (.to/.cuda/.cpu)
        self.forked_worker = False  # True in a DataLoader worker process
        self._pid = os.getpid()

    # -- lifecycle -----------------------------------------------------------

    def start(self) -> Simulation:
        global _active
        with _lock:
            if _active is not None:
                raise UsageError(
                    "a simulation is already running",
                    fix="leave the running td.simulate() block first",
                )
            _active = self
        try:
            import torch.utils._device

            torch.utils._device._device_constructors()  # cached: the real factories
            if "torch._dynamo" in sys.modules:
                _skip_in_dynamo()
            else:  # importing it costs a second: only when the program does (optimizers do)
                sys.meta_path.insert(0, _DynamoImport(self))

            self._patches = Patches(self)
            self._patches.install()
            self.distributed = DistributedLayer(self)  # multi-GPU: sim/distributed.py
            self.distributed.install()
            self._mode = VirtualDeviceMode(self)
            _push_mode(self._mode)
            self._thread = threading.get_ident()
        except BaseException:
            if self.distributed is not None:
                self.distributed.uninstall()
                self.distributed = None
            if self._patches is not None:
                self._patches.uninstall()
            _active = None
            raise
        return self

    def stop(self) -> None:
        global _active
        if _active is not self:
            return
        sys.meta_path[:] = [f for f in sys.meta_path if not isinstance(f, _DynamoImport)]
        try:
            if self._mode is not None and self._thread == threading.get_ident():
                _pop_mode()
        finally:
            if self.distributed is not None:
                self.distributed.uninstall()
                write_record(self.distributed.record.to_json())
                self.distributed = None
            if self._patches is not None:
                self._patches.uninstall()
            self._mode = None
            self._patches = None
            _active = None
        if self.keep_going and self.records:
            self._write(self.summary())

    def __enter__(self) -> Simulation:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()
        if exc is not None:
            hide_own_frames(exc)

    @contextlib.contextmanager
    def patches_paused(self) -> Iterator[None]:
        """The real torch functions for a while (while torch._dynamo is imported)."""
        if self._patches is None:
            yield
            return
        self._patches.uninstall()
        try:
            yield
        finally:
            self._patches = Patches(self)
            self._patches.install()

    @contextlib.contextmanager
    def thread_mode(self) -> Iterator[None]:
        """Run a new thread under the dispatch mode (modes are per thread)."""
        mode = self._mode
        if mode is None or _active is not self:
            yield
            return
        _push_mode(mode)
        try:
            yield
        finally:
            with contextlib.suppress(Exception):
                _pop_mode()

    @contextlib.contextmanager
    def lenient_region(self) -> Iterator[None]:
        """Treat CPU tensors as wild while a known composite runs."""
        self.lenient += 1
        try:
            yield
        finally:
            self.lenient -= 1

    # -- violations ----------------------------------------------------------

    @property
    def errors(self) -> list[Diagnosis]:
        """Each distinct device error seen so far (keep-going mode), in order."""
        return [record[0] for record in self.records.values()]

    def violation(self, violation: Violation, *, op: Any) -> Any:
        """Raise what CUDA would raise, or (keep_going) record it and continue.

        Returns the device the call's outputs should take when the run goes on.
        """
        __tracebackhide__ = True  # pytest: the user's line is the last one shown
        diagnosis = diagnose_violation(violation, sys._getframe(1))
        if self.keep_going:
            record = self.records.get(diagnosis.key)
            if record is None:
                self.records[diagnosis.key] = [diagnosis, 1]
                self._write(
                    f"torchdoctor simulate: this would fail on a {self.backend.upper()} machine:"
                    f"\n  {violation.exc_type.__name__}: {violation.message.strip()}\n"
                    f"{diagnosis.render()}\n"
                )
            else:
                record[1] += 1
            return _heal(violation, diagnosis)

        error_type = _ERROR_TYPES.get(violation.exc_type, VirtualDeviceError)
        error = error_type(violation.message)
        error.diagnosis = diagnosis  # type: ignore[attr-defined]
        _add_note(error, diagnosis.render())
        raise error.with_traceback(None) from None

    def invalid_ordinal(self, device: torch.device) -> Any:
        message = INVALID_ORDINAL
        if self.backend != "cuda":
            message = f"Invalid device: {device} (this machine simulates one {self.backend})"
        self.violation(
            Violation(
                message,
                exc_type=torch.AcceleratorError if self.backend == "cuda" else RuntimeError,
                kind="ordinal",
            ),
            op=None,
        )
        return self.devices.devices[0]

    def loaded_device_checkpoint(self, location: str) -> None:
        """A checkpoint storage tagged `location` is loaded without a map_location to CPU."""
        if not self.strict_load:
            return
        name = self.backend.upper()
        self.violation(
            Violation(
                f"Attempting to deserialize object on a {name} device but "
                f"torch.{self.backend}.is_available() is False. If you are running on a "
                "CPU-only machine, please use torch.load with "
                "map_location=torch.device('cpu') to map your storages to the CPU.",
                kind="load",
            ),
            op=None,
        )

    def enter_forked_worker(self) -> None:
        """In a DataLoader worker: fork copied the mode; nothing here may use the GPU."""
        if os.getpid() == self._pid:
            return  # not forked (workers run in this process only in tests that fake it)
        self.forked_worker = True
        if self._mode is not None:
            with contextlib.suppress(Exception):
                _pop_mode()

    def gpu_in_forked_worker(self) -> None:
        """CUDA refuses to initialise in a process forked after the parent used it."""
        if self.backend != "cuda":
            return
        self.violation(
            Violation(
                "Cannot re-initialize CUDA in forked subprocess. To use CUDA with "
                "multiprocessing, you must use the 'spawn' start method",
                kind="fork",
            ),
            op=None,
        )

    def mps_float64(self, tensor: torch.Tensor) -> None:
        """MPS cannot hold float64 tensors: PyTorch refuses them on a Mac."""
        self.violation(
            Violation(
                "Cannot convert a MPS Tensor to float64 dtype as the MPS framework doesn't "
                "support float64. Please use float32 instead.",
                exc_type=TypeError,
                kind="mps-float64",
            ),
            op=None,
        )

    def unsupported(self, what: str) -> None:

        raise SimulationUnsupportedError(
            f"{what} is not simulated by td.simulate({self.backend!r})",
            fix="run this part on a real GPU machine, or leave it out of the simulated run",
        )

    # -- reporting -----------------------------------------------------------

    def summary(self) -> str:
        if not self.records:
            return "torchdoctor simulate: no device errors\n"
        total = sum(count for _, count in self.records.values())
        lines = [
            f"torchdoctor simulate: {len(self.records)} distinct device error(s) "
            f"({total} occurrence(s)) that a {self.backend.upper()} machine would raise:"
        ]
        for diagnosis, count in self.records.values():
            first_line = diagnosis.message.strip().splitlines()[0]
            lines.append(f"  [{diagnosis.code}] {diagnosis.location()}: {first_line} (x{count})")
        return "\n".join(lines) + "\n"

    def _write(self, text: str) -> None:
        stream = self.report if self.report is not None else sys.stderr
        stream.write(text)
        with contextlib.suppress(Exception):
            stream.flush()


def simulate(
    device: str = "cuda",
    *,
    devices: int = 1,
    keep_going: bool = False,
    strict_load: bool = False,
    cpu_autocast: bool = False,
    report: IO[str] | None = None,
) -> Simulation:
    """Run the enclosed code on a virtual accelerator: `with td.simulate("cuda"): train()`.

    Args:
        device: "cuda" or "mps".
        devices: how many devices the machine pretends to have (cuda only).
        keep_going: record each distinct device error and go on instead of raising;
            a summary is written to `report` (stderr) at the end.
        strict_load: make `torch.load` of a GPU checkpoint without `map_location` fail
            as on a CPU-only machine (TD402) instead of restoring onto the virtual device.
        cpu_autocast: run `autocast("cuda")` as CPU autocast (float16 by default), so
            dtype bugs that only mixed precision causes show up; the numbers then differ
            from a plain CPU run. Off: CUDA autocast is a no-op on the CPU tensors.
        report: where keep-going messages go (default: sys.stderr).
    """
    return Simulation(
        device,
        devices=devices,
        keep_going=keep_going,
        strict_load=strict_load,
        cpu_autocast=cpu_autocast,
        report=report,
    )
