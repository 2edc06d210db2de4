"""`torchdoctor check --add-noqa`: every finding silenced where the engine honours it."""

from __future__ import annotations

from pathlib import Path

from tests.check.conftest import CLI, write

TRAIN = """\
import torch
from torch.utils.data import DataLoader


def train(model, dataset, device):
    loader = DataLoader(dataset, batch_size=8)
    model.to(device)
    for images, labels in loader:
        images.to(device)
        loss = model(images).sum()
    state = torch.load(  # noqa: TD101
        "ckpt.pt",
    )
    other = torch.load("b.pt")  # noqa
    return state, other, loss
"""


def test_add_noqa_silences_every_finding_and_keeps_the_code(td: CLI, project: Path) -> None:
    write(project / "train.py", TRAIN.replace("\n", "\r\n"))
    before = td("check", "--no-cache", "--format", "concise", "train.py")
    assert {line.split()[1] for line in before.out.splitlines()} == {"TD102", "TD112", "TD402"}

    run = td("check", "--add-noqa", "train.py")
    assert run.code == 0
    assert run.out.strip() == "Added 3 noqa comment(s) in 1 file."
    data = (project / "train.py").read_bytes()
    assert b"\n" not in data.replace(b"\r\n", b"")  # the file's line endings are kept
    text = data.decode().replace("\r\n", "\n")
    assert "        images.to(device)  # noqa: TD102\n" in text
    assert "        loss = model(images).sum()  # noqa: TD112\n" in text
    # a statement over several lines: the code joins the list on a line the engine reads
    assert '    state = torch.load(  # noqa: TD101, TD402\n        "ckpt.pt",\n    )\n' in text
    assert '    other = torch.load("b.pt")  # noqa\n' in text  # already silenced
    assert td("check", "--no-cache", "train.py").code == 0

    again = td("check", "--add-noqa", "train.py")
    assert again.out.strip() == "Added 0 noqa comment(s) in 0 files."
    assert (project / "train.py").read_bytes() == data


def test_add_noqa_refuses_stdin_and_fix(td: CLI, project: Path) -> None:
    write(project / "train.py", TRAIN)
    run = td("check", "--add-noqa", "--fix", "train.py")
    assert run.code == 2 and run.err.count("\n") == 1 and "--add-noqa" in run.err
    assert (project / "train.py").read_text() == TRAIN
