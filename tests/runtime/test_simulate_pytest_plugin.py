"""The pytest plugin: the `simulated_cuda` fixture, the `td_simulate` marker, `--td-simulate`."""

from __future__ import annotations

import pytest

# pytester's in-process runs drop modules first imported inside them; importing these
# here keeps torch's lazily loaded parts (dynamo) loaded once, as in a real session.
import torch._dynamo  # noqa: F401

import torchdoctor.runtime.sim  # noqa: F401

pytest_plugins = ("pytester",)


GPU_TESTS = """
import pytest
import torch

def test_written_for_a_gpu():
    model = torch.nn.Linear(3, 1).cuda()
    assert model(torch.ones(2, 3, device="cuda")).device.type == "cuda"

def test_with_a_device_bug():
    model = torch.nn.Linear(3, 1).cuda()
    model(torch.ones(2, 3))  # the batch was never moved
"""


def test_fixture_and_marker_simulate_one_test(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(
        """
        import pytest
        import torch

        def test_gpu(simulated_cuda):
            assert torch.cuda.is_available()
            assert torch.ones(2, device="cuda").device.type == "cuda"
            assert simulated_cuda.backend == "cuda"

        def test_plain_afterwards():
            assert not torch.cuda.is_available()

        @pytest.mark.td_simulate("cuda", devices=2)
        def test_two_gpus():
            assert torch.cuda.device_count() == 2
            assert torch.zeros(1, device="cuda:1").get_device() == 1
        """
    )
    pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:asyncio").assert_outcomes(
        passed=3
    )


def test_option_runs_a_gpu_suite_on_this_machine(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(GPU_TESTS)
    plain = pytester.runpytest_inprocess("-p", "no:cacheprovider", "-p", "no:asyncio")
    plain.assert_outcomes(failed=2)  # no GPU here: both fail without the simulation
    result = pytester.runpytest_inprocess(
        "-p", "no:cacheprovider", "-p", "no:asyncio", "--td-simulate", "cuda"
    )
    result.assert_outcomes(passed=1, failed=1)
    result.stdout.fnmatch_lines(
        [
            "*Expected all tensors to be on the same device, but got mat1 is on cpu*",
            "*torchdoctor simulate [[]TD112[]]*",
        ]
    )
