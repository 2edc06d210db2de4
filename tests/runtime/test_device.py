"""td.pick_device, td.to_device, td.device_of and @td.device_safe on real tensors.

Moves go to the `meta` device, a real second device on a CPU machine; GPU
answers of torch.cuda/mps/xpu are faked (see fakes.py).
"""

from __future__ import annotations

import collections
import dataclasses
import traceback
import types
from typing import Any, NamedTuple

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import torchdoctor as td
from torchdoctor.errors import DeviceMismatchError, DeviceUnavailableError, InvalidArgumentError
from torchdoctor.explain.frames import is_library_file
from torchdoctor.runtime.device import _availability_problem

from .fakes import clear_device_env, fake_cuda, fake_mps, fake_xpu

META = torch.device("meta")
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def _no_device_env(monkeypatch: pytest.MonkeyPatch) -> None:
    clear_device_env(monkeypatch)


# --------------------------------------------------------------------------- pick_device


def test_pick_device_is_cpu_on_this_machine() -> None:
    assert td.pick_device() == CPU


def test_prefer_wins_over_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHDOCTOR_DEVICE", "cuda")  # unavailable here, but not consulted
    assert td.pick_device("cpu") == CPU
    assert td.pick_device(torch.device("meta")) == META


def test_environment_choice_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cuda(monkeypatch, count=2)
    monkeypatch.setenv("TORCHDOCTOR_DEVICE", "cuda:1")
    assert td.pick_device() == torch.device("cuda", 1)
    monkeypatch.setenv("TORCHDOCTOR_DEVICE", "cpu")
    assert td.pick_device() == CPU


def test_unavailable_environment_choice_is_an_error_not_a_fallback(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("TORCHDOCTOR_DEVICE", "cuda")
    with pytest.raises(
        DeviceUnavailableError, match=r"TORCHDOCTOR_DEVICE asks for 'cuda'.*CPU-only"
    ):
        td.pick_device()
    fake_cuda(monkeypatch, count=2)
    monkeypatch.setenv("TORCHDOCTOR_DEVICE", "cuda:2")
    with pytest.raises(DeviceUnavailableError, match=r"only 2 cuda device\(s\)"):
        td.pick_device()


def test_unknown_device_names(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHDOCTOR_DEVICE", "gpu")
    with pytest.raises(DeviceUnavailableError, match=r"unknown device 'gpu'.*did you mean 'cuda'"):
        td.pick_device()
    with pytest.raises(InvalidArgumentError, match="not int"):
        td.pick_device(3)  # type: ignore[arg-type]


def test_accelerator_order(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_xpu(monkeypatch)
    assert td.pick_device() == torch.device("xpu", 0)
    fake_mps(monkeypatch)
    assert td.pick_device() == torch.device("mps", 0)
    state = fake_cuda(monkeypatch, count=2)
    state.current = 1  # the user already chose cuda:1
    assert td.pick_device() == torch.device("cuda", 1)


def test_torchrun_local_rank_selects_and_sets_the_gpu(monkeypatch: pytest.MonkeyPatch) -> None:
    state = fake_cuda(monkeypatch, count=2)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert td.pick_device() == torch.device("cuda", 1)
    assert state.set_device_calls == [torch.device("cuda", 1)]
    # an explicit bare "cuda" means this process's GPU too
    assert td.pick_device("cuda") == torch.device("cuda", 1)


def test_torchrun_without_gpu_is_cpu(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert td.pick_device() == CPU
    fake_mps(monkeypatch)  # no collective backend takes MPS tensors
    assert td.pick_device() == CPU


def test_local_rank_beyond_the_visible_gpus(monkeypatch: pytest.MonkeyPatch) -> None:
    fake_cuda(monkeypatch, count=2)
    monkeypatch.setenv("LOCAL_RANK", "3")
    with pytest.raises(DeviceUnavailableError, match="nproc_per_node=2"):
        td.pick_device()
    fake_cuda(monkeypatch, count=1)  # the launcher shows each process one GPU
    assert td.pick_device() == torch.device("cuda", 0)
    monkeypatch.setenv("LOCAL_RANK", "x")
    with pytest.raises(InvalidArgumentError, match="LOCAL_RANK='x'"):
        td.pick_device()


def test_availability_problems_name_the_cause(monkeypatch: pytest.MonkeyPatch) -> None:
    assert _availability_problem(META) is None
    assert "no MPS support" in str(_availability_problem(torch.device("mps")))
    monkeypatch.setattr(torch.version, "cuda", "12.6")  # a CUDA wheel on a machine without GPU
    assert "nvidia-smi" in str(_availability_problem(torch.device("cuda")))


# --------------------------------------------------------------------------- to_device


class Point(NamedTuple):
    x: torch.Tensor
    label: str


@dataclasses.dataclass
class Batch:
    inputs: torch.Tensor
    meta: dict[str, Any]
    cached: torch.Tensor = dataclasses.field(init=False)
    post_inits: int = 0

    def __post_init__(self) -> None:
        self.post_inits += 1
        self.cached = self.inputs * 2


@dataclasses.dataclass(frozen=True)
class Frozen:
    x: torch.Tensor
    n: int = 1


@dataclasses.dataclass(frozen=True, slots=True)
class FrozenSlots:
    x: torch.Tensor


class MovesItself:
    """Like HF BatchEncoding: a container with its own .to()."""

    def __init__(self, data: torch.Tensor) -> None:
        self.data = data
        self.calls: list[tuple[Any, dict[str, Any]]] = []

    def to(self, device: torch.device, *, non_blocking: bool = False) -> MovesItself:
        moved = MovesItself(self.data.to(device))
        moved.calls = [*self.calls, (device, {"non_blocking": non_blocking})]
        return moved


def on(device: torch.device, *tensors: torch.Tensor) -> bool:
    return all(t.device == device for t in tensors)


def test_nested_builtin_containers_keep_their_shape() -> None:
    array = np.zeros(3)
    batch = {"x": torch.ones(2), "pair": (torch.ones(1), [torch.zeros(1), 5, "s", None, array])}
    moved = td.to_device(batch, "meta")
    assert type(moved["pair"]) is tuple and type(moved["pair"][1]) is list
    assert on(META, moved["x"], moved["pair"][0], moved["pair"][1][0])
    assert moved["pair"][1][1:4] == [5, "s", None] and moved["pair"][1][4] is array
    assert on(CPU, batch["x"]), "the input is not modified"


def test_mappings_keep_type_factory_and_metadata() -> None:
    state = nn.BatchNorm1d(2).state_dict()
    moved_state = td.to_device(state, "meta")
    assert type(moved_state) is collections.OrderedDict
    assert moved_state._metadata == state._metadata  # type: ignore[attr-defined]

    counts = collections.defaultdict(list, {"a": torch.ones(1)})
    moved = td.to_device(counts, "meta")
    assert isinstance(moved, collections.defaultdict) and moved.default_factory is list
    assert on(META, moved["a"]) and moved["new"] == []

    user = collections.UserDict({"a": torch.ones(1)})
    moved_user = td.to_device(user, "meta")
    assert type(moved_user) is collections.UserDict and on(META, moved_user["a"])

    proxy = types.MappingProxyType({"a": torch.ones(1)})
    moved_proxy = td.to_device(proxy, "meta")
    assert type(moved_proxy) is types.MappingProxyType and on(META, moved_proxy["a"])


def test_sequences_keep_their_type() -> None:
    point = td.to_device(Point(torch.ones(1), "p"), "meta")
    assert type(point) is Point and point.label == "p" and on(META, point.x)

    values, indices = torch.tensor([[1.0, 3.0]]).max(dim=1)
    result = td.to_device(torch.tensor([[1.0, 3.0]]).max(dim=1), "meta")
    assert type(result).__name__ == "max" and on(META, result.values, result.indices)
    assert values.item() == 3.0 and indices.item() == 1

    queue = td.to_device(collections.deque([torch.ones(1)], maxlen=4), "meta")
    assert isinstance(queue, collections.deque) and queue.maxlen == 4 and on(META, queue[0])

    class Tensors(list):  # a list subclass with an attribute
        tag = "kept"

    moved = td.to_device(Tensors([torch.ones(1)]), "meta")
    assert type(moved) is Tensors and on(META, moved[0])

    frozen = td.to_device(frozenset([torch.ones(1)]), "meta")
    assert type(frozen) is frozenset and on(META, *frozen)
    assert td.to_device(torch.Size([2, 3]), "meta") == torch.Size([2, 3])


def test_dataclasses_including_frozen_slots_and_init_false() -> None:
    batch = Batch(torch.ones(2), {"ids": torch.arange(2)})
    moved = td.to_device(batch, "meta")
    assert type(moved) is Batch and on(META, moved.inputs, moved.cached, moved.meta["ids"])
    assert moved.post_inits == 1, "__post_init__ is not run again"
    assert on(CPU, batch.inputs, batch.cached), "the original is not modified"

    frozen = td.to_device(Frozen(torch.ones(1), n=7), "meta")
    assert type(frozen) is Frozen and frozen.n == 7 and on(META, frozen.x)
    slotted = td.to_device(FrozenSlots(torch.ones(1)), "meta")
    assert type(slotted) is FrozenSlots and on(META, slotted.x)

    @dataclasses.dataclass
    class Lazy:
        x: torch.Tensor
        cache: torch.Tensor = dataclasses.field(init=False)  # never set

    lazy = td.to_device(Lazy(torch.ones(1)), "meta")
    assert on(META, lazy.x) and not hasattr(lazy, "cache")

    noted = Sample(torch.ones(1), torch.arange(1), Point(torch.ones(1), "p"))
    noted.note = "kept"  # type: ignore[attr-defined]  # not a field
    moved_noted = td.to_device(noted, "meta")
    assert moved_noted.note == "kept" and on(META, moved_noted.x, moved_noted.point.x)  # type: ignore[attr-defined]


def test_objects_with_their_own_to_are_asked_to_move() -> None:
    moved = td.to_device({"enc": MovesItself(torch.ones(1))}, "meta", non_blocking=True)
    assert on(META, moved["enc"].data)
    assert moved["enc"].calls == [(META, {"non_blocking": True})]
    with pytest.raises(InvalidArgumentError, match=r"MovesItself.to\(\) takes no dtype"):
        td.to_device(MovesItself(torch.ones(1)), "meta", dtype=torch.float16)

    packed = nn.utils.rnn.pack_sequence([torch.ones(3, 2), torch.ones(2, 2)])
    moved_packed = td.to_device(packed, "meta")
    assert on(META, moved_packed.data) and on(CPU, moved_packed.batch_sizes)


def test_modules_move_in_place() -> None:
    model = nn.Linear(2, 2)
    assert td.to_device(model, "meta", dtype=torch.float64) is model
    assert model.weight.device == META and model.weight.dtype == torch.float64


def test_dtype_casts_floating_tensors_only() -> None:
    moved = td.to_device(
        [torch.ones(1), torch.arange(2), torch.tensor([True])], CPU, dtype=torch.half
    )
    assert [t.dtype for t in moved] == [torch.float16, torch.int64, torch.bool]
    with pytest.raises(InvalidArgumentError, match="floating"):
        td.to_device(torch.ones(1), CPU, dtype=torch.int32)


@dataclasses.dataclass
class Sample:
    x: torch.Tensor
    ids: torch.Tensor
    point: Point


def _nested_batch() -> dict[str, Any]:
    return {
        "samples": [Sample(torch.ones(2), torch.arange(2), Point(torch.ones(1), "p"))],
        "pair": (torch.ones(1), torch.arange(1)),
        "features": {"f": [torch.ones(1), 3]},
    }


@pytest.mark.parametrize(
    "kwargs",
    [{}, {"dtype": torch.float16}, {"non_blocking": True}],
    ids=["plain move inline", "dtype cast", "non_blocking"],
)
def test_every_container_kind_is_rebuilt_and_the_input_left_alone(kwargs: dict[str, Any]) -> None:
    # The plain move is inlined in each container's comprehension; dtype= and
    # non_blocking= take the per-tensor mover instead: both paths, every hot handler.
    batch = _nested_batch()
    moved = td.to_device(batch, "meta", **kwargs)
    sample = moved["samples"][0]
    assert type(sample) is Sample and type(sample.point) is Point and sample.point.label == "p"
    assert type(moved["pair"]) is tuple and moved["features"]["f"][1] == 3
    tensors = [sample.x, sample.ids, sample.point.x, *moved["pair"], moved["features"]["f"][0]]
    assert on(META, *tensors)
    f32, f16, i64 = torch.float32, torch.float16, torch.int64
    cast = f16 if "dtype" in kwargs else f32
    assert [t.dtype for t in tensors] == [cast, i64, cast, cast, i64, cast]
    before = batch["samples"][0]
    originals = [before.x, before.ids, before.point.x, *batch["pair"], batch["features"]["f"][0]]
    assert on(CPU, *originals), "the input is not modified"
    assert [t.dtype for t in originals] == [f32, i64, f32, f32, i64, f32]
    for new, old in [
        (moved, batch),
        (moved["samples"], batch["samples"]),
        (sample, batch["samples"][0]),
        (sample.point, batch["samples"][0].point),
        (moved["features"]["f"], batch["features"]["f"]),
    ]:
        assert new is not old


def test_same_device_is_a_no_op_and_parameters_are_tensors() -> None:
    tensor, param = torch.ones(1), nn.Parameter(torch.ones(1))
    assert td.to_device(tensor, "cpu") is tensor
    assert td.to_device({"p": param}, "cpu")["p"] is param
    assert on(META, td.to_device(param, "meta"))


def _walk(obj: Any) -> list[Any]:
    """obj and every container and tensor inside it, depth first."""
    if isinstance(obj, dict):
        return [obj, *(x for v in obj.values() for x in _walk(v))]
    if isinstance(obj, (list, tuple)):
        return [obj, *(x for v in obj for x in _walk(v))]
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return [obj, *(x for f in dataclasses.fields(obj) for x in _walk(getattr(obj, f.name)))]
    return [obj]


@pytest.mark.parametrize("target", ["cpu", "meta"])
def test_nothing_to_move_returns_the_input_itself(target: str) -> None:
    # Like Tensor.to returning self: every container whose items all stayed is kept.
    batch = td.to_device(_nested_batch(), target)
    for _ in range(3):  # first call, then the variant that skips tensors already there
        assert td.to_device(batch, target) is batch
    collections_ = {"d": collections.OrderedDict(a=torch.ones(1)), "q": collections.deque([3])}
    frozen = frozenset([torch.ones(1)])
    for obj in [collections_, frozen, Frozen(torch.ones(1), n=1), FrozenSlots(torch.ones(1))]:
        assert td.to_device(obj, "cpu") is obj


def test_only_containers_holding_a_moved_tensor_are_new() -> None:
    batch: dict[str, Any] = {
        "there": [torch.ones(1, device="meta"), "label"],
        "mixed": (torch.ones(1, device="meta"), torch.ones(1)),
        "sample": Sample(torch.ones(1), torch.arange(1), Point(torch.ones(1, device="meta"), "p")),
    }
    before = [(id(x), getattr(x, "device", None)) for x in _walk(batch)]
    for _ in range(3):  # whichever variant to_device picked last, the same result
        for warm_up in [batch, td.to_device(batch, "meta")]:
            td.to_device(warm_up, "meta")
            moved = td.to_device(batch, "meta")
            assert moved is not batch and moved["there"] is batch["there"]
            assert moved["mixed"] is not batch["mixed"] and moved["mixed"][0] is batch["mixed"][0]
            sample = moved["sample"]
            assert sample is not batch["sample"] and sample.point is batch["sample"].point
            assert on(META, *moved["mixed"], sample.x, sample.ids)
            after = [(id(x), getattr(x, "device", None)) for x in _walk(batch)]
            assert after == before, "the input is not modified"


def test_an_error_inside_the_walk_is_torchdoctors_frame_not_the_users() -> None:
    # The walk runs generated code: its frames must count as torchdoctor's (hidden from
    # `torchdoctor run` tracebacks, never "Where" in an explanation) and show their source.
    batch = {"samples": [Sample(torch.ones(1, device="meta"), torch.arange(1), Point(1, "p"))]}
    with pytest.raises(NotImplementedError) as info:
        td.to_device(batch, "cpu")  # a meta tensor has no data to copy
    frames = traceback.extract_tb(info.value.__traceback__)
    generated = [f for f in frames if "to_device generated" in f.filename]
    assert generated, [f.filename for f in frames]
    assert all(is_library_file(f.filename) and f.line for f in generated)


def test_default_device_is_pick_device(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TORCHDOCTOR_DEVICE", "meta")
    assert on(META, td.to_device(torch.ones(1)))


class ToSpy:
    """Records the keyword arguments of every Tensor.to call (and moves nothing)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch, pinned: set[int]) -> None:
        self.calls: list[dict[str, Any]] = []
        spy = self

        def fake_to(tensor: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
            spy.calls.append(kwargs)
            return tensor

        monkeypatch.setattr(torch.Tensor, "to", fake_to)
        monkeypatch.setattr(torch.Tensor, "is_pinned", lambda t: id(t) in pinned)


def test_non_blocking_defaults_to_pinned_host_to_cuda_only(monkeypatch: pytest.MonkeyPatch) -> None:
    pinned, pageable = torch.ones(1), torch.ones(1)
    spy = ToSpy(monkeypatch, {id(pinned)})
    td.to_device([pinned, pageable], "cuda:0")
    assert spy.calls == [{"non_blocking": True}, {"non_blocking": False}]
    spy.calls.clear()
    td.to_device([pinned], "meta")
    td.to_device([pinned], "mps", non_blocking=True)  # never asynchronous on MPS
    assert spy.calls == [{}, {}]
    spy.calls.clear()
    td.to_device([pageable], "cuda:0", non_blocking=True)
    td.to_device([pinned], "cuda:0", non_blocking=False)
    assert spy.calls == [{"non_blocking": True}, {}]


def test_bad_devices_and_arguments() -> None:
    with pytest.raises(DeviceUnavailableError, match="unknown device 'gpu'"):
        td.to_device(torch.ones(1), "gpu")
    with pytest.raises(DeviceUnavailableError, match=r"cannot move to cuda.*CPU-only"):
        td.to_device({"x": torch.ones(1)}, "cuda")
    with pytest.raises(InvalidArgumentError, match="device name"):
        td.to_device(torch.ones(1), 0)  # type: ignore[arg-type]
    with pytest.raises(InvalidArgumentError, match="non_blocking"):
        td.to_device(torch.ones(1), "cpu", non_blocking="yes")  # type: ignore[arg-type]
    loop: list[Any] = [torch.ones(1)]
    loop.append(loop)
    with pytest.raises(InvalidArgumentError, match="cycle"):
        td.to_device(loop, "meta")


leaves = st.one_of(
    st.integers(), st.text(max_size=3), st.none(), st.builds(torch.ones, st.integers(0, 3))
)
nested = st.recursive(
    leaves,
    lambda children: st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(st.text(max_size=3), children, max_size=4),
    ),
    max_leaves=20,
)


def _shape(obj: Any) -> Any:
    """The structure with every tensor replaced by its shape, to compare before and after."""
    if isinstance(obj, torch.Tensor):
        return ("tensor", tuple(obj.shape))
    if isinstance(obj, dict):
        return {k: _shape(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return (type(obj).__name__, [_shape(v) for v in obj])
    return obj


def _tensors(obj: Any) -> list[torch.Tensor]:
    if isinstance(obj, torch.Tensor):
        return [obj]
    values = (
        obj.values() if isinstance(obj, dict) else obj if isinstance(obj, (list, tuple)) else []
    )
    return [t for v in values for t in _tensors(v)]


@settings(max_examples=60, deadline=None)
@given(nested)
def test_any_nesting_keeps_structure_and_moves_every_tensor(obj: Any) -> None:
    moved = td.to_device(obj, "meta")
    assert _shape(moved) == _shape(obj)
    assert all(t.device == META for t in _tensors(moved))
    assert td.to_device(moved, "meta") is moved, "nothing left to move: the same object"


# --------------------------------------------------------------------------- device_of


class Encoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = nn.Linear(2, 2)
        self.pos = torch.zeros(2)  # not a buffer: model.to() leaves it behind (TD104)


class Model(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encoder = Encoder()
        self.head = nn.Linear(2, 1)

    @td.device_safe
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder.layer(x) + self.encoder.pos)


def test_device_of_single_device() -> None:
    assert td.device_of(torch.ones(1, device="meta")) == META
    assert td.device_of(nn.Linear(2, 2)) == CPU
    assert td.device_of({"a": [torch.ones(1)], "b": Point(torch.ones(1), "x")}) == CPU


def test_device_of_names_every_stray_path() -> None:
    batch = {"ids": torch.ones(1, device="meta"), "mask": torch.ones(1)}
    with pytest.raises(DeviceMismatchError) as info:
        td.device_of(batch)
    message = str(info.value)
    # a tie: the first device seen counts as the majority, the other is listed
    assert 'batch["mask"]: cpu' in message and 'batch["ids"]: meta' in message
    assert message.startswith("batch has tensors on 2 devices") and "(TD120)" in message


def test_device_of_finds_an_unregistered_tensor_left_behind() -> None:
    model = Model().to("meta")
    with pytest.raises(DeviceMismatchError) as info:
        td.device_of(model)
    message = str(info.value)
    assert "model.encoder.pos: cpu  (plain tensor attribute, TD104)" in message
    assert "model.*: meta (4 tensors)" in message
    assert "register_buffer" in message


def test_device_of_without_tensors() -> None:
    with pytest.raises(InvalidArgumentError, match="has no parameters"):
        td.device_of(nn.ReLU())
    with pytest.raises(InvalidArgumentError, match="has no tensors"):
        td.device_of({"a": 1})


# --------------------------------------------------------------------------- device_safe


@td.device_safe
def weighted(batch: dict[str, torch.Tensor], weight: torch.Tensor, scale: torch.Tensor) -> Any:
    return batch["x"] * weight * scale


def test_device_safe_passes_matching_devices_and_cpu_scalars() -> None:
    out = weighted({"x": torch.ones(2)}, torch.ones(2), scale=torch.tensor(3.0))
    assert out.tolist() == [3.0, 3.0]
    assert weighted.__name__ == "weighted"

    @td.device_safe
    def devices(*tensors: torch.Tensor) -> set[torch.device]:
        return {t.device for t in tensors}

    # a 0-dim CPU tensor is allowed beside tensors on another device, as in PyTorch
    assert devices(torch.ones(2, device="meta"), torch.tensor(2.0)) == {META, CPU}
    with pytest.raises(DeviceMismatchError, match=r"devices\(\) got .*\n  tensors\[1\]: cpu"):
        devices(torch.ones(2, device="meta"), torch.ones(1))


def test_device_safe_names_the_argument_paths() -> None:
    with pytest.raises(DeviceMismatchError) as info:
        weighted({"x": torch.ones(2, device="meta")}, torch.ones(2), scale=torch.ones(2))
    message = str(info.value)
    assert message.startswith(
        "weighted() got tensors on 2 devices: cpu (2 tensors), meta (1 tensor)"
    )
    assert 'batch["x"]: meta' in message
    assert "weight: cpu" in message and "scale: cpu" in message


def test_device_safe_on_a_module_method_checks_its_parameters() -> None:
    model = Model()
    assert model(torch.ones(1, 2)).shape == (1, 1)
    with pytest.raises(DeviceMismatchError) as info:
        model(torch.ones(1, 2, device="meta"))
    message = str(info.value)
    assert message.startswith("Model.forward() got tensors on 2 devices")
    assert "x: meta" in message and "self.*: cpu (5 tensors)" in message


def test_device_safe_with_parentheses() -> None:
    @td.device_safe()
    def add(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return a + b

    with pytest.raises(DeviceMismatchError, match="a: cpu"):
        add(torch.ones(1), torch.ones(1, device="meta"))
