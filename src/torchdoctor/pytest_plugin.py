"""pytest plugin: run model tests on the virtual accelerator (`td.simulate`).

Loaded automatically when torchdoctor is installed (entry point `pytest11`).

* the `simulated_cuda` fixture runs one test on a virtual CUDA machine and
  yields the `Simulation`;
* `@pytest.mark.td_simulate("cuda", devices=2)` does the same for a marked test;
* `pytest --td-simulate cuda [--td-devices N]` runs every test that way, so a
  test suite written for GPUs finds its device bugs on a CPU-only machine.

Importing this module does not import torch (it is loaded by every pytest run).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("torchdoctor", "torchdoctor virtual accelerator")
    group.addoption(
        "--td-simulate",
        choices=("cuda", "mps"),
        default=None,
        help="run every test on a virtual GPU (torchdoctor's td.simulate)",
    )
    group.addoption(
        "--td-devices",
        type=int,
        default=1,
        help="number of simulated GPUs with --td-simulate (default 1)",
    )


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "td_simulate(device='cuda', devices=1, **options): run the test under "
        "torchdoctor's td.simulate",
    )


def _simulation(device: str, **options: Any) -> Iterator[Any]:
    from torchdoctor.runtime.sim import active, simulate

    running = active()
    if running is not None:  # already simulated (--td-simulate plus the fixture)
        yield running
        return
    with simulate(device, **options) as simulation:
        yield simulation


@pytest.fixture
def simulated_cuda() -> Iterator[Any]:
    """Run the test on a virtual CUDA GPU; yields the `Simulation`."""
    yield from _simulation("cuda")


@pytest.fixture(autouse=True)
def _td_simulate_marker_or_option(request: pytest.FixtureRequest) -> Iterator[Any]:
    marker = request.node.get_closest_marker("td_simulate")
    backend = request.config.getoption("--td-simulate")
    if marker is not None:
        yield from _simulation(marker.args[0] if marker.args else "cuda", **marker.kwargs)
    elif backend is not None:
        yield from _simulation(backend, devices=request.config.getoption("--td-devices"))
    else:
        yield None
