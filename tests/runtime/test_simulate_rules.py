"""td.simulate: CUDA's device rules one by one (design note rules 1-13).

Each rule is tested both ways: what a CUDA build of PyTorch allows runs (and
its outputs land on the right device), what it rejects raises the exception
type and the exact message PyTorch raises on a GPU machine.
"""

from __future__ import annotations

import io
import re
from collections.abc import Iterator
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

import torchdoctor as td
from torchdoctor.runtime.simulate import Simulation

CUDA0 = torch.device("cuda", 0)
CUDA1 = torch.device("cuda", 1)
CPU = torch.device("cpu")
TWO_DEVICES = "Expected all tensors to be on the same device, but found at least two devices, "


@pytest.fixture(autouse=True)
def _one_thread() -> Iterator[None]:
    """One intra-op thread: on a busy 2-core machine OpenMP threads only wait for each other."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def sim() -> Iterator[Simulation]:
    with td.simulate("cuda") as simulation:
        yield simulation


@pytest.fixture
def sim2() -> Iterator[Simulation]:
    with td.simulate("cuda", devices=2) as simulation:
        yield simulation


def raises(message: str, exc: type[BaseException] = RuntimeError) -> Any:
    """pytest.raises for exactly PyTorch's message."""
    return pytest.raises(exc, match="^" + re.escape(message) + "(\n|$)")  # notes follow


def checked(arg: str, dev: str, common: str, method: str) -> str:
    return (
        f"Expected all tensors to be on the same device, but got {arg} is on {dev}, different "
        f"from other tensors on {common} (when checking argument in method wrapper_CUDA_{method})"
    )


# --------------------------------------------------------------------------- rule 1: pointwise


def test_rule1_same_device_and_one_cpu_scalar_are_allowed(sim: Simulation) -> None:
    x = torch.randn(3, device="cuda")
    scalar = torch.tensor(2.0)
    assert (x + x).device == CUDA0
    assert (x * scalar).device == CUDA0
    assert (scalar * x).device == CUDA0  # the CPU scalar may come first
    assert (x * 2).device == CUDA0
    assert x.add_(scalar).device == CUDA0
    assert torch.lerp(x, x, scalar).device == CUDA0


def test_rule1_cpu_tensor_beside_cuda_is_rejected_whatever_the_order(sim: Simulation) -> None:
    x, y = torch.randn(3, device="cuda"), torch.randn(3)
    with raises(TWO_DEVICES + "cuda:0 and cpu!"):
        x + y
    with raises(TWO_DEVICES + "cuda:0 and cpu!"):
        y + x


def test_rule1_two_cpu_scalars_are_too_many(sim: Simulation) -> None:
    x, scalar = torch.randn(3, device="cuda"), torch.tensor(2.0)
    with raises("Trying to pass too many CPU scalars to non-CPU kernel!"):
        torch.addcmul(x, scalar, scalar)


def test_rule1_cpu_output_is_never_exempt(sim: Simulation) -> None:
    loss = torch.randn(4, device="cuda").sum()
    total = torch.tensor(0.0)
    with raises(TWO_DEVICES + "cuda:0 and cpu!"):
        total += loss
    total += loss.item()  # the fix
    assert total.device == CPU


def test_rule1_two_gpus(sim2: Simulation) -> None:
    a, b = torch.ones(2, device="cuda:0"), torch.ones(2, device="cuda:1")
    assert (b * 3).device == CUDA1
    with raises(TWO_DEVICES + "cuda:0 and cuda:1!"):
        a + b


# --------------------------------------------------------------------------- rule 2: where


def test_rule2_where_takes_any_number_of_cpu_scalars(sim: Simulation) -> None:
    x = torch.randn(4, device="cuda")
    out = torch.where(x > 0, torch.tensor(1.0), torch.tensor(-1.0))
    assert out.device == CUDA0
    assert torch.where(x > 0, x, 0.0).device == CUDA0


def test_rule2_where_rejects_a_cpu_condition(sim: Simulation) -> None:
    x = torch.randn(4, device="cuda")
    with raises(TWO_DEVICES + "cuda:0 and cpu!"):
        torch.where(torch.randn(4) > 0, x, x)


# --------------------------------------------------------------------------- rule 3: others


def test_rule3_first_tensor_fixes_the_device(sim: Simulation) -> None:
    a, b = torch.randn(2, 3, device="cuda"), torch.randn(3, 2)
    with raises(checked("mat2", "cpu", "cuda:0", "mm")):
        torch.mm(a, b)
    with raises(checked("mat2", "cuda:0", "cpu", "mm")):
        torch.mm(b.t(), a.t())
    with raises(checked("tensors", "cpu", "cuda:0", "cat")):
        torch.cat([a, b.t()])
    assert torch.mm(a, b.cuda()).device == CUDA0


def test_rule3_has_no_scalar_exemption(sim: Simulation) -> None:
    weight = torch.randn(2, 3, device="cuda")
    bias = torch.randn(2, device="cuda")
    with raises(checked("mat1", "cpu", "cuda:0", "addmm")):
        F.linear(torch.randn(1, 3), weight, bias)


def test_rule3_loss_with_labels_left_on_cpu(sim: Simulation) -> None:
    logits = torch.randn(4, 3, device="cuda")
    with raises(checked("target", "cpu", "cuda:0", "nll_loss_forward")):
        F.cross_entropy(logits, torch.tensor([0, 1, 2, 0]))


# --------------------------------------------------------------------------- rule 4: indexing


def test_rule4_indices_on_cpu_or_on_the_tensors_device(sim: Simulation) -> None:
    x = torch.arange(5.0, device="cuda")
    idx = torch.tensor([0, 3])
    assert x[idx].device == CUDA0
    assert x[idx.cuda()].device == CUDA0
    assert x[torch.tensor([True, False, True, False, True])].tolist() == [0.0, 2.0, 4.0]


def test_rule4_cuda_indices_into_a_cpu_tensor(sim: Simulation) -> None:
    table = torch.arange(5.0)
    with raises(
        "indices should be either on cpu or on the same device as the indexed tensor (cpu)"
    ):
        table[torch.tensor([1, 2], device="cuda")]


def test_rule4_assigned_value_may_be_a_cpu_scalar(sim: Simulation) -> None:
    x = torch.zeros(4, device="cuda")
    idx = torch.tensor([1, 2])
    x[idx] = 1.0
    x[idx.cuda()] = torch.tensor(2.0)
    assert x.tolist() == [0.0, 2.0, 2.0, 0.0]
    with raises(TWO_DEVICES + "cuda:0 and cpu!"):
        x[idx] = torch.tensor([5.0, 6.0])


# --------------------------------------------------------------------------- rule 5: masked_fill


def test_rule5_masked_fill(sim: Simulation) -> None:
    x = torch.randn(4, device="cuda")
    assert x.masked_fill(x > 0, 0.0).device == CUDA0
    assert x.masked_fill(x > 0, torch.tensor(1.0)).device == CUDA0  # 0-dim CPU value
    message = (
        "expected self and mask to be on the same device, but got mask on cpu and self on cuda:0"
    )
    with raises(message):
        x.masked_fill(torch.randn(4) > 0, 0.0)


# --------------------------------------------------------------------------- rule 6: wording


def test_rule6_embedding_says_index_select(sim: Simulation) -> None:
    emb = nn.Embedding(10, 4).to("cuda")
    assert emb(torch.tensor([1, 2], device="cuda")).device == CUDA0
    with raises(checked("index", "cpu", "cuda:0", "_index_select")):
        emb(torch.tensor([1, 2]))


def test_rule6_convolution_compares_tensor_types(sim: Simulation) -> None:
    conv = nn.Conv2d(1, 2, 3).cuda()
    assert conv(torch.randn(1, 1, 5, 5, device="cuda")).device == CUDA0
    with raises(
        "Input type (torch.FloatTensor) and weight type (torch.cuda.FloatTensor) should be the "
        "same or input should be a MKLDNN tensor and weight is a dense tensor"
    ):
        conv(torch.randn(1, 1, 5, 5))
    with raises(
        "Input type (torch.cuda.FloatTensor) and weight type (torch.FloatTensor) should be the same"
    ):
        conv.cpu()(torch.randn(1, 1, 5, 5, device="cuda"))


def test_rule6_rnn_wording(sim: Simulation) -> None:
    lstm = nn.LSTM(4, 5).cuda()
    x = torch.randn(2, 1, 4, device="cuda")
    out, (h, _) = lstm(x)
    assert out.device == h.device == CUDA0
    with raises(
        "Input and hidden tensors are not at the same device, found input tensor at cuda:0 and "
        "hidden tensor at cpu"
    ):
        lstm(x, (torch.zeros(1, 1, 5), torch.zeros(1, 1, 5)))
    with raises(
        "Input and parameter tensors are not at the same device, found input tensor at cpu and "
        "parameter tensor at cuda:0"
    ):
        nn.GRU(4, 5).cuda()(torch.randn(2, 1, 4))


# --------------------------------------------------------------------------- rule 7: copies


def test_rule7_copy_and_load_state_dict_cross_devices(sim: Simulation) -> None:
    host = torch.zeros(3)
    host.copy_(torch.ones(3, device="cuda"))
    assert host.device == CPU and host.tolist() == [1.0, 1.0, 1.0]
    model = nn.Linear(3, 2).cuda()
    model.load_state_dict(nn.Linear(3, 2).state_dict())  # CPU tensors into a CUDA model
    assert all(p.device == CUDA0 for p in model.parameters())


# --------------------------------------------------------------------------- rule 8: foreach


def test_rule8_foreach_is_checked_per_position(sim: Simulation) -> None:
    a, b = torch.ones(2, device="cuda"), torch.ones(2)
    out = torch._foreach_add([a, b], [a, b])
    assert [t.device for t in out] == [CUDA0, CPU]
    torch._foreach_add_([a], torch.tensor(1.0))  # a scalar tensor may be on the CPU
    assert a.tolist() == [2.0, 2.0]
    with raises(TWO_DEVICES + "cuda:0 and cpu!"):
        torch._foreach_add([a], [b])


@pytest.mark.parametrize("options", [{}, {"foreach": False}, {"fused": True}])
def test_rule8_optimizers_update_on_the_device(sim: Simulation, options: dict[str, bool]) -> None:
    model = nn.Linear(3, 2).cuda()
    opt = torch.optim.Adam(model.parameters(), lr=0.1, **options)
    model(torch.randn(4, 3, device="cuda")).sum().backward()
    opt.step()
    state = opt.state[model.weight]
    assert state["exp_avg"].device == CUDA0
    assert model.weight.grad is not None and model.weight.grad.device == CUDA0


def test_rule8_optimizer_over_two_gpus_groups_by_device(sim2: Simulation) -> None:
    a, b = nn.Linear(3, 3).to("cuda:0"), nn.Linear(3, 1).to("cuda:1")
    opt = torch.optim.SGD([*a.parameters(), *b.parameters()], lr=0.1, momentum=0.9)
    b(a(torch.randn(2, 3, device="cuda:0")).to("cuda:1")).sum().backward()
    torch.nn.utils.clip_grad_norm_([*a.parameters(), *b.parameters()], 1.0)
    opt.step()
    assert opt.state[b.weight]["momentum_buffer"].device == CUDA1
    assert a.weight.grad is not None and a.weight.grad.device == CUDA0


# --------------------------------------------------------------------------- rule 9: CPU by design


def test_rule9_packed_sequences_keep_lengths_on_cpu(sim: Simulation) -> None:
    x = torch.randn(2, 3, 4, device="cuda")
    packed = pack_padded_sequence(x, torch.tensor([3, 2]), batch_first=True)
    assert packed.data.device == CUDA0 and packed.batch_sizes.device == CPU
    out, _ = nn.LSTM(4, 5, batch_first=True).cuda()(packed)
    padded, lengths = pad_packed_sequence(out, batch_first=True)
    assert padded.device == CUDA0 and lengths.device == CPU
    with raises(
        "'lengths' argument should be a 1D CPU int64 tensor, but got 1D cuda:0 Long tensor"
    ):
        pack_padded_sequence(x, torch.tensor([3, 2], device="cuda"), batch_first=True)


def test_rule9_ctc_lengths(sim: Simulation) -> None:
    log_probs = torch.randn(6, 2, 5, device="cuda").log_softmax(2).requires_grad_()
    targets = torch.randint(1, 5, (2, 3), device="cuda")
    loss = F.ctc_loss(log_probs, targets, torch.tensor([6, 5]), torch.tensor([3, 2]))
    loss.backward()
    assert loss.device == CUDA0


# --------------------------------------------------------------------------- rule 10: outputs


def test_rule10_output_device(sim: Simulation) -> None:
    x = torch.randn(3, device="cuda")
    assert x.sum().device == CUDA0
    assert x.new_zeros(2).device == CUDA0
    assert torch.zeros_like(x).device == CUDA0
    assert torch.zeros_like(x, device="cpu").device == CPU  # explicit device= wins
    assert (torch.tensor(2.0) * torch.tensor(3.0)).device == CPU  # CPU scalars only
    assert F.one_hot(torch.tensor([0, 2], device="cuda"), 3).device == CUDA0  # a composite
    assert torch.arange(3, device=x.device).device == CUDA0
    assert x.tolist() == x.cpu().tolist()


def test_rule10_grad_flows_back_to_the_source_device(sim: Simulation) -> None:
    w = torch.randn(3, requires_grad=True)  # a CPU leaf
    (w.cuda() * 2).sum().backward()
    assert w.grad is not None and w.grad.device == CPU
    assert w.grad.tolist() == [2.0, 2.0, 2.0]


# --------------------------------------------------------------------------- rule 11: ordinals


INVALID_ORDINAL = "CUDA error: invalid device ordinal"


def test_rule11_invalid_ordinal(sim: Simulation) -> None:
    with pytest.raises(torch.AcceleratorError, match=INVALID_ORDINAL):
        torch.zeros(1, device="cuda:1")
    with pytest.raises(torch.AcceleratorError, match=INVALID_ORDINAL):
        torch.ones(2).to("cuda:1")
    with pytest.raises(torch.AcceleratorError, match=INVALID_ORDINAL):
        torch.cuda.set_device(1)
    torch.device("cuda:1")  # naming a device is fine


def test_rule11_second_gpu_exists_with_devices_2(sim2: Simulation) -> None:
    assert torch.cuda.device_count() == 2
    x = torch.zeros(1, device="cuda:1")
    assert x.device == CUDA1 and x.get_device() == 1
    torch.cuda.set_device(1)
    assert torch.ones(1, device="cuda").device == CUDA1
    with pytest.raises(torch.AcceleratorError, match=INVALID_ORDINAL):
        torch.zeros(1, device="cuda:2")


# --------------------------------------------------------------------------- rule 12: host access


NUMPY = (
    "can't convert cuda:0 device type tensor to numpy. Use Tensor.cpu() to copy the tensor to "
    "host memory first."
)


def test_rule12_item_tolist_and_print_work(sim: Simulation) -> None:
    x = torch.tensor([1.5, 2.5], device="cuda")
    assert x.sum().item() == 4.0
    assert x.tolist() == [1.5, 2.5]
    assert "device='cuda:0'" in repr(x)
    assert float(x[0]) == 1.5


def test_rule12_numpy_on_device_is_rejected(sim: Simulation) -> None:
    x = torch.ones(2, device="cuda")
    with raises(NUMPY, TypeError):
        x.numpy()
    with raises(NUMPY, TypeError):
        np.asarray(x)
    assert x.cpu().numpy().tolist() == [1.0, 1.0]
    assert x.numpy(force=True).tolist() == [1.0, 1.0]


def test_rule12_pin_memory(sim: Simulation) -> None:
    host = torch.ones(2)
    pinned = host.pin_memory()
    assert pinned.is_pinned() and not host.is_pinned()
    with raises("cannot pin 'torch.cuda.FloatTensor' only dense CPU tensors can be pinned"):
        torch.ones(2, device="cuda").pin_memory()


# --------------------------------------------------------------------------- rule 13: checkpoints


def _saved(obj: object) -> bytes:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return buffer.getvalue()


def test_rule13_save_writes_gpu_location_tags(sim: Simulation) -> None:
    data = _saved({"w": torch.ones(2, device="cuda"), "b": torch.zeros(1)})
    assert b"cuda:0" in data
    loaded = torch.load(io.BytesIO(data))  # no map_location: back on the virtual GPU
    assert loaded["w"].device == CUDA0 and loaded["b"].device == CPU
    assert torch.load(io.BytesIO(data), map_location="cpu")["w"].device == CPU


def test_rule13_gpu_checkpoint_fails_outside_like_on_a_cpu_machine() -> None:
    with td.simulate("cuda"):
        data = _saved(torch.ones(2, device="cuda"))
    with pytest.raises(RuntimeError, match="Attempting to deserialize object on a CUDA device"):
        torch.load(io.BytesIO(data))
    assert torch.load(io.BytesIO(data), map_location="cpu").tolist() == [1.0, 1.0]


def test_rule13_missing_ordinal_and_strict_load() -> None:
    with td.simulate("cuda", devices=2):
        data = _saved(torch.ones(2, device="cuda:1"))
    missing = (
        "Attempting to deserialize object on CUDA device 1 but torch.cuda.device_count() is 1."
    )
    with td.simulate("cuda"), pytest.raises(RuntimeError, match=re.escape(missing)):
        torch.load(io.BytesIO(data))
    with td.simulate("cuda", devices=2, strict_load=True):
        with pytest.raises(RuntimeError, match=re.escape("torch.cuda.is_available() is False")):
            torch.load(io.BytesIO(data))
        assert torch.load(io.BytesIO(data), map_location="cuda:0").device == CUDA0
