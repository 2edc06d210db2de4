"""Forward time with td.guard vs without, in one run: CNN and a 6-layer TransformerEncoder,
batch 1 and 32, eval and train. Also checks the Transformer's fused fast path is still taken.

    .venv/bin/python benchmarks/bench_guard.py [--repeats N]

The guard's checks run for the first `steps` calls (here 10) and are then gone; the number
reported is the steady state after them, as a ratio guarded / plain (fastest of many short
interleaved rounds, so load on a shared machine hits both sides alike). One thread.
"""

from __future__ import annotations

import argparse
import statistics
import time
import warnings
from collections.abc import Callable

import torch
from torch import nn

import torchdoctor as td
from torchdoctor.runtime.guard import GuardWarning

WARMUP_STEPS = 10


def cnn() -> nn.Module:
    return nn.Sequential(
        nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        nn.Conv2d(32, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU(), nn.MaxPool2d(2),
        nn.Flatten(), nn.Dropout(0.1), nn.Linear(64 * 8 * 8, 10),
    )  # fmt: skip


def transformer() -> nn.Module:
    layer = nn.TransformerEncoderLayer(128, 8, dim_feedforward=512, batch_first=True)
    return nn.TransformerEncoder(layer, 6, enable_nested_tensor=False)


def inputs(kind: str, batch: int) -> torch.Tensor:
    return torch.randn(batch, 3, 32, 32) if kind == "cnn" else torch.randn(batch, 32, 128)


def time_calls(call: Callable[[], object], number: int) -> float:
    start = time.perf_counter()
    for _ in range(number):
        call()
    return (time.perf_counter() - start) / number


def measure(kind: str, batch: int, training: bool, rounds: int) -> tuple[float, float]:
    torch.manual_seed(0)
    model = (cnn() if kind == "cnn" else transformer()).train(training)
    x = inputs(kind, batch)
    plain_model = model
    guarded_model = (cnn() if kind == "cnn" else transformer()).train(training)
    guarded_model.load_state_dict(model.state_dict())
    guard = td.guard(guarded_model, steps=WARMUP_STEPS)
    context = torch.enable_grad() if training else torch.no_grad()
    with context:
        for _ in range(WARMUP_STEPS + 2):  # the guard's checks end here
            guarded_model(x)
            plain_model(x)
        assert not guard.checking
        # calls per round: about 0.05 s of work; many short interleaved rounds
        one = time_calls(lambda: plain_model(x), 3)
        number = max(2, int(0.05 / max(one, 1e-6)))
        plain, guarded = [], []
        for _ in range(rounds):
            plain.append(time_calls(lambda: plain_model(x), number))
            guarded.append(time_calls(lambda: guarded_model(x), number))
    guard.remove()
    # The fastest round of each side: the least disturbed by other load on the machine.
    return min(plain), min(guarded)


def per_call_overhead(rounds: int) -> float:
    """Seconds the guard adds to one call, measured on nn.Identity (nothing else to time)."""
    plain_model, guarded_model = nn.Identity(), nn.Identity()
    guard = td.guard(guarded_model, checks=False)
    x = torch.zeros(1)
    plain, guarded = [], []
    for _ in range(rounds):
        plain.append(time_calls(lambda: plain_model(x), 20000))
        guarded.append(time_calls(lambda: guarded_model(x), 20000))
    guard.remove()
    return min(guarded) - min(plain)


def fast_path_taken() -> tuple[int, int]:
    """Calls of the fused encoder-layer kernel in 2 eval forwards, plain and guarded."""
    counts = {"n": 0}
    fused = torch._transformer_encoder_layer_fwd

    def counting(*args: object, **kwargs: object) -> object:
        counts["n"] += 1
        return fused(*args, **kwargs)

    torch._transformer_encoder_layer_fwd = counting
    try:
        model = transformer().eval()
        x = inputs("transformer", 2)
        with torch.no_grad():
            model(x), model(x)
            plain = counts["n"]
            counts["n"] = 0
            with td.guard(model, steps=1):
                model(x), model(x)  # first with the checks on, then without
            guarded = counts["n"]
    finally:
        torch._transformer_encoder_layer_fwd = fused
    return plain, guarded


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=15, help="interleaved rounds per case")
    args = parser.parse_args()
    warnings.simplefilter("ignore", GuardWarning)
    torch.set_num_threads(1)
    print(
        f"torch {torch.__version__}, {torch.get_num_threads()} threads, "
        f"{args.repeats} rounds, checks on for the first {WARMUP_STEPS} calls"
    )
    print(f"{'model':12} {'batch':>5} {'mode':5} {'plain ms':>9} {'guard ms':>9} {'ratio':>7}")
    ratios = []
    for kind in ("cnn", "transformer"):
        for batch in (1, 32):
            for training in (False, True):
                plain, guarded = measure(kind, batch, training, args.repeats)
                ratio = guarded / plain
                ratios.append(ratio)
                mode = "train" if training else "eval"
                print(
                    f"{kind:12} {batch:5} {mode:5} {plain * 1e3:9.3f} {guarded * 1e3:9.3f} "
                    f"{ratio:7.4f}"
                )
    plain_fused, guarded_fused = fast_path_taken()
    added = per_call_overhead(args.repeats)
    print(f"added per guarded call (nn.Identity): {added * 1e6:.3f} us")
    print(f"geometric-mean ratio: {statistics.geometric_mean(ratios):.4f}")
    print(
        f"fused encoder-layer kernel calls (2 eval forwards x 6 layers): "
        f"plain {plain_fused}, guarded {guarded_fused}"
    )


if __name__ == "__main__":
    main()
