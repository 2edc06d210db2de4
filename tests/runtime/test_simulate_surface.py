"""Nothing a GPU accepts is refused under simulation, and every result is the CPU's result.

A property test calls a broad slice of the public tensor API — every public method
that takes no argument, another tensor of the same shape, or a scalar — once on a
CPU tensor without simulation and once on the same values on the virtual GPU, and
compares: the same values (or the same exception type), and tensor results on the
GPU. Then the legacy spellings a GPU accepts and a CPU build refuses.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import torchdoctor as td

CUDA0 = torch.device("cuda", 0)
# The property test calls hundreds of tensor methods on random values; torch's own
# UserWarnings about those calls (degrees of freedom <= 0, deprecated spellings, sparse
# tensors, istft without a window) are the same with and without simulation and are not
# what is compared here.
pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

# Not the same on a GPU by design: where the tensor lives and how it is stored, the
# host copies (numpy and pinning raise for GPU tensors on a real GPU too), random draws,
# and what registers hooks or changes global state.
EXCLUDED = {
    "cpu", "cuda", "to", "type", "get_device", "numpy", "pin_memory", "is_pinned",
    "share_memory_", "is_shared", "data_ptr", "storage", "untyped_storage", "_typed_storage",
    "storage_offset", "storage_type", "const_data_ptr", "mutable_data_ptr", "backward",
    "register_hook", "register_post_accumulate_grad_hook",
    "retain_grad", "requires_grad_", "detach_", "bernoulli", "bernoulli_", "cauchy_",
    "exponential_", "geometric_", "log_normal_", "normal_", "random_", "uniform_", "multinomial",
    "dim_order", "tolist", "item", "new", "new_empty", "new_empty_strided", "empty_like",
    "resize_", "resize_as_", "set_", "record_stream", "to_dense", "to_mkldnn", "ipu", "xpu",
    "mps", "mtia", "hpu", "is_cuda", "is_cpu", "module_load", "nonzero_static",
    "sparse_resize_", "sparse_resize_and_clear_", "share_memory", "apply_", "map_", "map2_",
    "as_subclass", "align_to", "refine_names", "rename", "rename_", "unflatten", "to_padded_tensor",
    "qscheme", "q_scale", "q_zero_point", "q_per_channel_scales", "int_repr", "dequantize",
    "smm", "_values", "values", "indices", "crow_indices", "col_indices", "ccol_indices",
    "row_indices", "coalesce", "is_coalesced",
}  # fmt: skip


def _methods() -> list[str]:
    names = []
    for name in dir(torch.Tensor):
        if name.startswith("_") or name in EXCLUDED:
            continue
        if callable(getattr(torch.Tensor, name, None)):
            names.append(name)
    return names


METHODS = _methods()
DTYPES = (torch.float32, torch.int64, torch.bool, torch.float64)


def _outcome(call: Callable[[], Any]) -> tuple[str, Any]:
    try:
        return "ok", call()
    except Exception as error:
        return type(error).__name__, None


def _same(plain: Any, simulated: Any) -> bool:
    if isinstance(plain, torch.Tensor):
        if not isinstance(simulated, torch.Tensor):
            return False
        if plain.is_sparse or plain.layout != torch.strided:
            plain, simulated = plain.to_dense(), simulated.to_dense()
        try:
            torch.testing.assert_close(
                simulated.detach().cpu(), plain.detach(), rtol=0, atol=0, equal_nan=True
            )
        except AssertionError:
            return False
        return True
    if isinstance(plain, (tuple, list)):
        return (
            isinstance(simulated, (tuple, list))
            and len(plain) == len(simulated)
            and all(_same(a, b) for a, b in zip(plain, simulated, strict=True))
        )
    if isinstance(plain, float) and isinstance(simulated, float):
        return plain == simulated or (math.isnan(plain) and math.isnan(simulated))
    if isinstance(plain, (bool, int, str, torch.dtype, torch.Size, type(None))):
        return plain == simulated
    return type(plain) is type(simulated)


def _on_gpu(result: Any) -> bool:
    if isinstance(result, torch.Tensor):
        return result.device == CUDA0
    if isinstance(result, (tuple, list)):
        return all(_on_gpu(item) for item in result)
    return True


@settings(
    max_examples=300,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture],
)
@given(
    name=st.sampled_from(METHODS),
    shape=st.lists(st.integers(1, 3), min_size=1, max_size=2),
    dtype=st.sampled_from(DTYPES),
    argument=st.sampled_from(["none", "tensor", "scalar"]),
    seed=st.integers(0, 2**16),
)
def test_tensor_api_gives_the_cpu_result_on_the_virtual_gpu(
    name: str, shape: list[int], dtype: torch.dtype, argument: str, seed: int
) -> None:
    generator = torch.Generator().manual_seed(seed)
    base = (torch.randn(shape, generator=generator) * 3).to(dtype)
    other = (torch.randn(shape, generator=generator) * 3).to(dtype)

    def call(x: torch.Tensor, y: torch.Tensor) -> Any:
        args = {"none": (), "tensor": (y,), "scalar": (2,)}[argument]
        return getattr(x, name)(*args)

    plain = _outcome(lambda: call(base.clone(), other.clone()))
    with td.simulate("cuda"):
        x, y = base.clone().cuda(), other.clone().cuda()
        simulated = _outcome(lambda: call(x, y))
        assert simulated[0] == plain[0], (name, argument, plain, simulated)
        assert _same(plain[1], simulated[1]), (name, argument, plain[1], simulated[1])
        assert _on_gpu(simulated[1]), (name, argument, simulated[1])


@pytest.mark.parametrize(
    ("make", "dtype"),
    [
        (lambda: torch.ones(2, device="cuda").type(torch.int64), torch.int64),
        (lambda: torch.ones(2, device="cuda").type(torch.cuda.DoubleTensor), torch.float64),
        (lambda: torch.ones(2).type("torch.cuda.LongTensor"), torch.int64),
        (lambda: torch.cuda.FloatTensor(3), torch.float32),
        (lambda: torch.cuda.FloatTensor(2, 3), torch.float32),
        (lambda: torch.cuda.LongTensor([1, 2]), torch.int64),
        (lambda: torch.cuda.HalfTensor(2), torch.float16),
        (lambda: torch.cuda.BoolTensor([True]), torch.bool),
        (lambda: torch.ones(2, device="cuda").new(3), torch.float32),
        (lambda: torch.ones(2, device="cuda").new_tensor([1.0]), torch.float32),
        (lambda: torch.sparse_coo_tensor([[0, 1]], [1.0, 2.0], (3,), device="cuda"), torch.float32),
        (lambda: torch.ones(2, 2, device="cuda").to_sparse(), torch.float32),
        (lambda: torch.ones(2, 2, device="cuda").to_sparse_csr(), torch.float32),
        (lambda: torch.sparse.mm(torch.eye(2).to_sparse().cuda(), torch.ones(2, 2).cuda()),
         torch.float32),
    ],
)  # fmt: skip
def test_what_a_gpu_accepts_is_accepted(
    make: Callable[[], torch.Tensor], dtype: torch.dtype
) -> None:
    with td.simulate("cuda"):
        made = make()
        assert (made.device, made.dtype) == (CUDA0, dtype)
        assert made.is_cuda


def test_legacy_types_answer_isinstance_as_on_a_gpu() -> None:
    with td.simulate("cuda"):
        on_gpu = torch.ones(2, device="cuda")
        assert isinstance(on_gpu, torch.cuda.FloatTensor)
        assert not isinstance(on_gpu, torch.cuda.LongTensor)
        assert not isinstance(torch.ones(2), torch.cuda.FloatTensor)
        assert torch.ones(2).type(torch.cuda.FloatTensor).device == CUDA0
    with pytest.raises(TypeError, match="not available"):  # the real type again after the block
        torch.cuda.FloatTensor(3)


@pytest.mark.parametrize("name", ["quantile", "nanquantile"])
@pytest.mark.parametrize("q", [1.5, -0.25, [0.2, 1.0000001]])
def test_quantile_out_of_range_raises_as_on_the_cpu(name: str, q: Any) -> None:
    """torch skips this range check under any dispatch mode; the simulation keeps it."""
    values = torch.arange(5.0)
    tensor_q = torch.tensor(q)
    with pytest.raises(RuntimeError, match="range"):
        getattr(torch, name)(values, tensor_q)
    with td.simulate("cuda"):
        on_gpu = values.to("cuda")
        with pytest.raises(RuntimeError, match="range"):
            getattr(torch, name)(on_gpu, tensor_q.to("cuda"))
        with pytest.raises(RuntimeError, match="range"):
            getattr(on_gpu, name)(tensor_q.to("cuda"))
        assert getattr(on_gpu, name)(torch.tensor(0.5, device="cuda")).item() == 2.0
