"""td.simulate as an API: the simulated machine, its lifecycle, diagnosis, keep-going."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import torchdoctor as td
from torchdoctor.errors import SimulationUnsupportedError, UsageError
from torchdoctor.runtime.simulate import Simulation, VirtualDeviceError, active

CUDA0, CUDA1, CPU = torch.device("cuda", 0), torch.device("cuda", 1), torch.device("cpu")


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """One intra-op thread: on a busy 2-core machine OpenMP threads only wait for each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def sim() -> Iterator[Simulation]:
    with td.simulate("cuda", devices=2) as simulation:
        yield simulation


# --------------------------------------------------------------------------- the machine


def test_torch_cuda_reports_the_virtual_machine(sim: Simulation) -> None:
    assert torch.cuda.is_available() and torch.cuda.is_initialized()
    assert torch.cuda.device_count() == 2
    assert torch.cuda.current_device() == 0
    assert torch.cuda.get_device_name(1) == "torchdoctor virtual GPU"
    assert torch.cuda.get_device_properties(0).total_memory > 0
    assert torch.cuda.get_device_capability() == (8, 0)
    assert torch.cuda.is_bf16_supported()
    assert torch.cuda.memory_allocated() == torch.cuda.max_memory_allocated() == 0
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
    torch.cuda.synchronize()
    assert td.pick_device() == CUDA0  # the runtime library sees a GPU machine


def test_streams_events_and_device_contexts(sim: Simulation) -> None:
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    stream = torch.cuda.Stream()
    start.record()
    with torch.cuda.stream(stream):
        x = torch.ones(2, device="cuda")
    torch.cuda.current_stream().wait_stream(stream)
    x.record_stream(torch.cuda.current_stream())
    end.record()

    end.synchronize()
    assert start.elapsed_time(end) >= 0 and x.device == CUDA0
    with torch.cuda.device(1):
        assert torch.zeros(1, device="cuda").device == CUDA1
    assert torch.zeros(1, device="cuda").device == CUDA0
    torch.cuda.set_device("cuda:1")
    assert torch.ones(1).cuda().device == CUDA1


def test_torch_accelerator(sim: Simulation) -> None:
    assert torch.accelerator.is_available()
    assert torch.accelerator.current_accelerator() == torch.device("cuda")
    assert torch.accelerator.device_count() == 2
    torch.accelerator.set_device_index(1)
    assert torch.accelerator.current_device_index() == 1
    with torch.accelerator.device_index(0):
        assert torch.zeros(1, device="cuda").device == CUDA0
    assert torch.accelerator.current_device_index() == 1


def test_default_device_generators_and_device_context(sim: Simulation) -> None:
    torch.set_default_device("cuda")
    try:
        assert torch.zeros(2).device == CUDA0
        assert torch.get_default_device() == CUDA0
    finally:
        torch.set_default_device(None)
    with torch.device("cuda:1"):
        assert torch.ones(1).device == CUDA1
    assert torch.ones(1).device == CPU
    gen = torch.Generator(device="cuda").manual_seed(0)
    assert gen.device == CUDA0 and isinstance(gen, torch.Generator)
    assert torch.randn(2, device="cuda", generator=gen).device == CUDA0


def test_module_moves_and_device_queries(sim: Simulation) -> None:
    model = nn.Linear(3, 2)
    assert model.to(1).weight.device == CUDA1  # a bare ordinal
    assert model.cuda().weight.is_cuda and model.weight.get_device() == 0
    assert model.weight.type() == "torch.cuda.FloatTensor"
    assert model.cpu().weight.is_cpu and model.weight.get_device() == -1
    x = torch.ones(2, device="cuda")
    assert x.to(torch.float64).device == CUDA0  # a dtype change keeps the device
    assert x.to(torch.ones(1, device="cuda:1")).device == CUDA1
    assert x.type(torch.cuda.DoubleTensor).dtype == torch.float64
    assert torch.device(1) == CUDA1 and isinstance(torch.device(0), torch.device)
    with pytest.raises(torch.AcceleratorError, match="invalid device ordinal"):
        torch.device(2)


def test_data_loader_workers_and_pinned_memory(sim: Simulation) -> None:
    loader = DataLoader(
        TensorDataset(torch.arange(8.0)), batch_size=4, num_workers=1, pin_memory=True
    )
    batches = [batch for (batch,) in loader]
    assert all(b.is_pinned() and b.device == CPU for b in batches)
    moved = batches[0].to("cuda", non_blocking=True)
    assert moved.device == CUDA0 and moved.tolist() == [0.0, 1.0, 2.0, 3.0]


def test_threads_run_under_the_rules(sim: Simulation) -> None:
    errors: list[str] = []

    def work() -> None:
        try:
            torch.ones(2, device="cuda") + torch.ones(2)
        except RuntimeError as exc:
            errors.append(str(exc).splitlines()[0])

    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    assert errors == [
        "Expected all tensors to be on the same device, but found at least two devices, "
        "cuda:0 and cpu!"
    ]


def test_torch_compile_runs_under_the_simulation(sim: Simulation) -> None:
    model = nn.Linear(3, 2).cuda()
    out = torch.compile(model, backend="aot_eager")(torch.ones(4, 3, device="cuda"))
    out.sum().backward()
    assert out.device == CUDA0 and model.weight.grad is not None
    assert model.weight.grad.device == CUDA0


def test_unsupported_features_say_so(sim: Simulation) -> None:
    with pytest.raises(SimulationUnsupportedError, match="CUDA graphs"):
        torch.cuda.CUDAGraph()
    # NCCL is simulated on gloo (runtime/sim/distributed.py): the script's code runs
    store = torch.distributed.HashStore()
    torch.distributed.init_process_group("nccl", store=store, rank=0, world_size=1)
    try:
        assert torch.distributed.get_backend() == "gloo"
        with pytest.raises(RuntimeError, match="No backend type associated with device type cpu"):
            torch.distributed.all_reduce(torch.ones(1))  # a CPU tensor under nccl
        flag = torch.ones(1, device="cuda")
        torch.distributed.all_reduce(flag)
        assert flag.device == torch.device("cuda", 0) and flag.item() == 1.0
    finally:
        torch.distributed.destroy_process_group()


def test_mps_simulation() -> None:
    with td.simulate("mps"):
        assert torch.backends.mps.is_available()
        x = torch.ones(2, device="mps")
        assert x.device == torch.device("mps", 0) and x.is_mps
        with pytest.raises(RuntimeError, match="found at least two devices, mps:0 and cpu!"):
            x + torch.ones(2)
        with pytest.raises(AssertionError, match="Torch not compiled with CUDA"):
            torch.ones(1).cuda()  # a Mac has no CUDA
        no_float64 = "Cannot convert a MPS Tensor to float64 dtype as the MPS framework"
        with pytest.raises(TypeError, match=no_float64):
            torch.from_numpy(np.zeros(3)).to("mps")  # NumPy's default float64
        with pytest.raises(TypeError, match=no_float64):
            x.double()
        assert torch.from_numpy(np.zeros(3)).float().to("mps").device.type == "mps"


# --------------------------------------------------------------------------- lifecycle


def test_everything_is_restored_on_exit() -> None:
    real_zeros, real_device = torch.zeros, torch.Tensor.__dict__.get("device")
    with td.simulate("cuda"):
        x = torch.ones(2, device="cuda")
        assert torch.zeros is not real_zeros and active() is not None
    assert torch.zeros is real_zeros and torch.Tensor.__dict__.get("device") is real_device
    assert not torch.cuda.is_available() and active() is None
    assert x.device == CPU  # real CPU tensors once the simulation is over
    assert (x + torch.ones(2)).tolist() == [2.0, 2.0]


def test_restored_after_an_error_inside() -> None:
    with pytest.raises(VirtualDeviceError), td.simulate("cuda"):
        torch.ones(1, device="cuda") + torch.ones(2)
    assert not torch.cuda.is_available() and active() is None


def test_bad_arguments_and_nesting() -> None:
    with pytest.raises(UsageError, match="cannot simulate 'xpu'"):
        td.simulate("xpu")
    with pytest.raises(UsageError, match="positive integer"):
        td.simulate("cuda", devices=0)
    with pytest.raises(UsageError, match="exactly one device"):
        td.simulate("mps", devices=2)
    with td.simulate("cuda"), pytest.raises(UsageError, match="already running"):
        td.simulate("cuda").start()


# --------------------------------------------------------------------------- diagnosis


class _Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.lin = nn.Linear(4, 4)
        self.register_buffer("scale", torch.ones(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.lin(x) * self.scale


class _Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.block = _Block()

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x)


def test_diagnosis_names_module_buffer_and_input(sim: Simulation) -> None:
    net = _Net().cuda()
    net.block.scale = torch.ones(4)  # replaced by a CPU tensor after the move
    batch = torch.randn(2, 4, device="cuda")
    with pytest.raises(VirtualDeviceError) as info:
        net(batch)
    diagnosis = info.value.diagnosis
    assert diagnosis.module == "net.block (_Block)"
    assert diagnosis.source == "return self.lin(x) * self.scale"  # innermost user frame
    names = {op.name: op for op in diagnosis.operands}
    assert names["net.block.scale"].kind == "buffer of _Block"
    assert names["net.block.scale"].device == "cpu"
    assert "test_simulate_api.py" in (names["net.block.scale"].created or "")
    assert diagnosis.code == "TD120"  # a registered buffer: the model was moved before
    text = diagnosis.render()
    assert text.startswith("torchdoctor simulate [TD120]: at ")
    assert "hint:" in text


# --------------------------------------------------------------------------- keep going


def test_keep_going_continues_past_every_kind_of_error() -> None:
    report = io.StringIO()
    with td.simulate("cuda", keep_going=True, report=report) as sim:
        x = torch.ones(3, device="cuda")
        y = x + torch.ones(3)  # recorded, runs on the GPU
        for _ in range(3):
            array = x.numpy()  # recorded once, then counted
        z = torch.zeros(1, device="cuda:3")  # recorded, lands on cuda:0
    assert y.tolist() == [2.0, 2.0, 2.0] and isinstance(array, np.ndarray)
    assert z.tolist() == [0.0]
    assert [d.code for d in sim.errors] == ["TD112", "TD106", "TD101"]
    assert [count for _, count in sim.records.values()] == [1, 3, 1]
    assert "3 distinct device error(s) (5 occurrence(s))" in report.getvalue()


def test_deepcopy_and_storage_access_keep_devices(sim: Simulation) -> None:
    import copy

    model = nn.Sequential(nn.Linear(3, 3), nn.BatchNorm1d(3)).cuda()
    twin = copy.deepcopy(model)
    for module in (model, twin):
        assert all(t.device == CUDA0 for t in [*module.parameters(), *module.buffers()])
    weight = model[0].weight
    repr(weight.untyped_storage())  # C++ wraps the storage in temporary tensors (set_)
    weight.untyped_storage().tolist()
    assert weight.device == CUDA0 and model[1].running_mean.device == CUDA0
    with pytest.raises(VirtualDeviceError):
        twin[1].running_mean + torch.ones(3)  # the copy's buffers are on the GPU too


def test_functions_grabbed_inside_behave_for_real_afterwards() -> None:
    with td.simulate("cuda"):
        from torch import zeros

        is_available = torch.cuda.is_available
        assert zeros(1, device="cuda").device == CUDA0 and is_available()
    assert not is_available()
    with pytest.raises(AssertionError, match="Torch not compiled with CUDA enabled"):
        zeros(1, device="cuda")


class _MovesInGetItem(torch.utils.data.Dataset[torch.Tensor]):
    def __len__(self) -> int:
        return 4

    def __getitem__(self, i: int) -> torch.Tensor:
        return torch.full((2,), float(i)).to("cuda")


def test_gpu_in_a_forked_dataloader_worker_fails_as_on_cuda(sim: Simulation) -> None:
    with pytest.raises(RuntimeError, match="Cannot re-initialize CUDA in forked subprocess"):
        next(iter(DataLoader(_MovesInGetItem(), batch_size=2, num_workers=1)))
    batch = next(iter(DataLoader(_MovesInGetItem(), batch_size=2)))  # in the main process: fine
    assert batch.device == CUDA0


def _mixed_precision_step() -> None:
    model = nn.Linear(3, 3).cuda()
    cache = torch.zeros(4, 3, device="cuda")
    with torch.autocast("cuda"):
        out = model(torch.randn(2, 3, device="cuda"))
        cache[torch.tensor([0, 1])] = out  # float16 under real autocast: a dtype bug


def test_cpu_autocast_opt_in_surfaces_mixed_precision_dtype_bugs() -> None:
    with td.simulate("cuda"):
        _mixed_precision_step()  # CUDA autocast is a no-op on the CPU tensors
    with (
        td.simulate("cuda", cpu_autocast=True),
        pytest.raises(RuntimeError, match="Index put requires the source and destination dtypes"),
    ):
        _mixed_precision_step()


def test_dynamo_is_imported_only_when_the_program_does_with_the_real_functions() -> None:
    """Importing torch._dynamo costs a second: not up front, and when an optimizer imports
    it mid-simulation it is imported with the patches paused, then torch.compile works."""
    import subprocess
    import sys
    import textwrap

    program = textwrap.dedent(
        """
        import sys, torch, torchdoctor as td
        with td.simulate("cuda"):
            assert "torch._dynamo" not in sys.modules
            model = torch.nn.Linear(3, 2).cuda()
            optimizer = torch.optim.Adam(model.parameters())  # imports torch._dynamo
            assert "torch._dynamo" in sys.modules
            assert torch.zeros(2, device="cuda").is_cuda  # the patches are back
            double = torch.compile(lambda x: x * 2, backend="eager")
            print(double(torch.ones(2, device="cuda")).device)
        print(any(type(f).__name__ == "_DynamoImport" for f in sys.meta_path))
        """
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, timeout=300
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["cuda:0", "False"]
