"""Runs of real torchrun/gloo jobs, tried once more when gloo aborts at exit.

Gloo's worker threads can outlive the interpreter when a rank exits under heavy load:
C++ then aborts the rank with the line below (pytorch/pytorch#179291, open upstream).
It is a race in torch's shutdown, not in what the tests check, so a run that ends
that way is run once more; everything else about the result is asserted as usual.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable

GLOO_EXIT_RACE = "terminate called without an active exception"


def run_past_gloo_exit_race(
    run: Callable[[], subprocess.CompletedProcess[str]],
) -> subprocess.CompletedProcess[str]:
    result = run()
    if result.returncode != 0 and GLOO_EXIT_RACE in result.stderr:
        result = run()
    return result
