"""Project facts built on demand: only the files that can answer are analysed."""

from __future__ import annotations

from torchdoctor.check.analysis.project_facts import build_project

CHECKPOINTS = """\
import torch


def save_state(net, path):
    torch.save(net.state_dict(), path)
"""

TRAIN = """\
from torch import nn

from checkpoints import save_state


def main(net, path):
    net = nn.DataParallel(net.cuda())
    save_state(net, path)
"""

OTHER = """\
from torch import nn


def run(net):
    return nn.DataParallel(net)
"""


def _project(train: str = TRAIN):
    return build_project(
        [("p/checkpoints.py", CHECKPOINTS), ("p/train.py", train), ("p/other.py", OTHER)]
    )


def test_wrapped_arguments_are_analysed_only_for_the_files_that_call_the_function() -> None:
    index = _project()
    assert [path for path, _ in index.wrapping_files] == ["p/train.py", "p/other.py"]
    assert index._wrapped == {}  # nothing analysed while the project is indexed
    facts = index.wrapped_arguments_for(["save_state", "unrelated"])
    assert list(facts) == ["save_state"]
    ((slot, passed),) = facts["save_state"]
    assert (slot, passed.where, passed.line) == ("0", "p/train.py", 8)
    # other.py never calls save_state: its text rules it out before any analysis
    assert list(index._wrapped) == ["p/train.py"]
    assert index.wrapped_arguments_for(["run"]) == {}


def test_the_fingerprint_follows_the_wrapping_files_text() -> None:
    before = _project()
    assert _project().fingerprint() == before.fingerprint()
    changed = _project(TRAIN.replace("save_state(net, path)", "save_state(net.module, path)"))
    assert changed.wrapped_digest != before.wrapped_digest
    assert changed.fingerprint() != before.fingerprint()


SAVER = """\
import torch

from models import Net


def export(model, path):
    torch.save(model, path)


torch.save(Net(), "net.pt")
"""

MODELS = """\
from torch import nn


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.act = lambda x: x
"""


def _pickling_project(saver: str = SAVER):
    return build_project([("p/saver.py", saver), ("p/models.py", MODELS)])


def test_module_pickles_are_parsed_only_when_a_rule_asks() -> None:
    index = _pickling_project()
    assert index._pickles is None  # nothing parsed while the project is indexed
    sites = {(where, text, cls) for where, text, cls, _ in index.module_pickles}
    assert sites == {
        ("p/saver.py:7", "torch.save(model, path)", ""),
        ("p/saver.py:10", 'torch.save(Net(), "net.pt")', "Net"),
    }
    assert index._pickles is not None  # built once, then kept


def test_the_fingerprint_follows_the_pickling_files_text() -> None:
    before = _pickling_project()
    assert _pickling_project().fingerprint() == before.fingerprint()
    changed = _pickling_project(
        SAVER.replace("torch.save(model, path)", "torch.save(model.state_dict(), path)")
    )
    assert changed.pickles_digest != before.pickles_digest
    assert changed.fingerprint() != before.fingerprint()
