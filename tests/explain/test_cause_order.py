"""The first cause follows what the message says, not just which entry it is."""

from __future__ import annotations

import pytest

from torchdoctor.explain.explainer import explain


@pytest.mark.parametrize(
    ("message", "first_cause"),
    [
        (
            "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 22.78 GiB. GPU 0 has "
            "a total capacity of 31.47 GiB of which 12.73 GiB is free.",
            "One operation asks for gigabytes at once",
        ),
        (
            "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 10.92 GiB "
            "total capacity; 10.21 GiB already allocated; 3.06 MiB free)",
            "Memory grows step after step",
        ),
        (
            "RuntimeError: DataLoader worker (pid 22048) is killed by signal: Killed.",
            "The host ran out of RAM",
        ),
        (
            "RuntimeError: DataLoader worker (pid 25902) is killed by signal: Segmentation fault",
            "Native code crashed inside the worker",
        ),
        (
            "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:32, "
            "unhandled cuda error, NCCL version 2.4.8",
            "A CUDA failure surfaced through NCCL",
        ),
        (
            "RuntimeError: NCCL error in: /pytorch/torch/lib/c10d/ProcessGroupNCCL.cpp:410, "
            "unhandled system error, NCCL version 2.4.8",
            "The nodes cannot reach each other",
        ),
    ],
)
def test_first_cause_matches_the_message(message: str, first_cause: str) -> None:
    assert explain(message).cause.startswith(first_cause)


def test_input_type_with_cuda_on_one_side_only_is_a_device_error() -> None:
    device = explain(
        "RuntimeError: Expected tensor for argument #1 'input' to have the same type as tensor "
        "for argument #2 'weight'; but type torch.cuda.FloatTensor does not equal "
        "torch.FloatTensor (while checking arguments for cudnn_convolution)"
    )
    dtype = explain(
        "RuntimeError: Expected tensor for argument #1 'grad_output' to have the same type as "
        "tensor for argument #2 'weight'; but type torch.cuda.HalfTensor does not equal "
        "torch.cuda.FloatTensor (while checking arguments for cudnn_convolution_backward_input)"
    )
    assert (device.topic, dtype.topic) == ("device", "dtype")
