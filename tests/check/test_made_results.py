"""The text gate of made results: which functions of a file may make a value worth
passing back to a caller in another file (analysis/made_results.py)."""

from __future__ import annotations

from pathlib import Path

from torchdoctor.check.analysis.made_results import TextDefs, makes

BUILDERS = """\
import torch


def get_device():
    return torch.device("cuda")


def build_net(width):
    net = torch.nn.Linear(width, 1)
    return net.to(get_device())


def build_from_config(
    cfg,
):
    return build_net(cfg.width)


def log_config(cfg):
    print(cfg)


def move_in_place(net):
    net.to(get_device())
"""


NAMES = ("get_device", "build_net", "build_from_config", "log_config", "move_in_place")


def _making(text: str) -> set[str]:
    defs = TextDefs(text)
    return {name for name in NAMES if defs.makes(name)}


def test_making_functions_follow_the_file_s_own_builders() -> None:
    assert _making(BUILDERS) == {"build_net", "build_from_config"}


def test_making_functions_read_every_line_end() -> None:
    assert _making(BUILDERS.replace("\n", "\r")) == {"build_net", "build_from_config"}


def test_makes_reads_a_re_exporting_init_once(tmp_path: Path) -> None:
    init = tmp_path / "__init__.py"
    init.write_text("from .builders import build_net\n")
    disk: dict[str, object] = {}
    assert makes(disk, str(init), "build_net")
    assert not makes(disk, str(init), "log_config")
    init.write_text("")  # read once per run: the answer stays
    assert makes(disk, str(init), "build_net")
