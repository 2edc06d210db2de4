"""The `torchdoctor run` options of the virtual accelerator (stdlib only: no torch import).

`torchdoctor run --simulate cuda [--devices N] [--keep-going] [--strict-load] train.py`
runs the program on a virtual GPU; see `torchdoctor.runtime.sim`.
"""

from __future__ import annotations

import argparse
from contextlib import AbstractContextManager
from typing import Any

from torchdoctor.errors import UsageError

BACKENDS = ("cuda", "mps")


def add_options(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("virtual accelerator")
    group.add_argument(
        "--simulate",
        type=parse_simulate,
        default=None,
        metavar="{cuda,cuda:N,mps}",
        help="run on a virtual GPU (cuda:N: a machine with N GPUs, e.g. for torchrun): every "
        "device bug fails as on a real one, with a diagnosis",
    )
    group.add_argument(
        "--devices",
        type=int,
        default=None,
        metavar="N",
        help="how many GPUs the simulated machine has (default 1)",
    )
    group.add_argument(
        "--keep-going",
        action="store_true",
        help="record each distinct device error and go on; summarise them at the end "
        "(exit code 1 if there was any)",
    )
    group.add_argument(
        "--strict-load",
        action="store_true",
        help="make torch.load of a GPU checkpoint without map_location fail as on a "
        "CPU-only machine",
    )
    group.add_argument(
        "--cpu-autocast",
        action="store_true",
        help="run autocast('cuda') as CPU autocast (float16) to surface mixed-precision "
        "dtype bugs; the numbers then differ from a plain CPU run",
    )


def parse_simulate(text: str) -> str:
    """`cuda`, `mps` or `cuda:N` (N GPUs, the same as --devices N)."""
    backend, _, count = text.partition(":")
    if backend not in BACKENDS or (count and (not count.isdigit() or int(count) < 1)):
        raise argparse.ArgumentTypeError(
            f"invalid choice: {text!r} (choose from cuda, cuda:N with N >= 1, mps)"
        )
    return text


def split_simulate(args: argparse.Namespace) -> tuple[str | None, int | None]:
    """The backend and device count from --simulate cuda:N and --devices N."""
    value = getattr(args, "simulate", None)
    devices = getattr(args, "devices", None)
    if value is None:
        return None, devices
    backend, _, count = value.partition(":")
    if count:
        if devices is not None and devices != int(count):
            raise UsageError(f"--simulate {value} and --devices {devices} disagree")
        devices = int(count)
    return backend, devices


def contexts(args: argparse.Namespace) -> list[AbstractContextManager[Any]]:
    """The simulation to enter around the program, if --simulate was given."""
    backend, devices = split_simulate(args)
    if backend is None:
        for flag, value in (
            ("--devices", devices is not None),
            ("--keep-going", getattr(args, "keep_going", False)),
            ("--strict-load", getattr(args, "strict_load", False)),
            ("--cpu-autocast", getattr(args, "cpu_autocast", False)),
        ):
            if value:
                raise UsageError(f"{flag} needs --simulate", fix=f"--simulate cuda {flag} ...")
        return []
    if devices is not None and devices < 1:
        raise UsageError(f"--devices must be at least 1, not {devices}")
    from torchdoctor._torch import require_torch

    require_torch("torchdoctor run --simulate")
    from torchdoctor.runtime.sim import simulate

    simulation = simulate(
        backend,
        devices=devices or 1,
        keep_going=args.keep_going,
        strict_load=args.strict_load,
        cpu_autocast=args.cpu_autocast,
    )

    args.simulation = simulation
    return [simulation]


def exit_code(args: argparse.Namespace, code: int) -> int:
    """A clean exit becomes 1 when --keep-going recorded device errors."""
    simulation = getattr(args, "simulation", None)
    if code == 0 and simulation is not None and simulation.records:
        return 1
    return code
