"""TD602's advice depends on the arguments: `Variable(x, requires_grad=True)` is no no-op
(it makes a new leaf that requires grad), so "use the tensor itself" would be wrong there."""

from __future__ import annotations

from torchdoctor.check.engine import check_source
from torchdoctor.check.registry import rules_by_code

SOURCE = """\
import torch
from torch.autograd import Variable

x = torch.ones(3)
a = Variable(x)
b = Variable(x, requires_grad=True)
c = Variable(x, requires_grad=False)
d = Variable(x, volatile=True)
e = Variable(x, volatile=is_training)
"""


def _messages() -> dict[int, str]:
    rule = rules_by_code()["TD602"]
    return {f.line: f.message for f in check_source(SOURCE, "a.py", [rule])}


def test_plain_wrapper_is_a_no_op() -> None:
    messages = _messages()
    assert "use the tensor itself" in messages[5]
    assert "use the tensor itself" in messages[7]


def test_requires_grad_names_the_equivalent_call() -> None:
    message = _messages()[6]
    assert "x.detach().requires_grad_()" in message
    assert "use the tensor itself" not in message


def test_volatile_points_at_no_grad() -> None:
    assert "torch.no_grad()" in _messages()[8]


def test_a_computed_volatile_flag_is_not_called_true() -> None:
    # `volatile=is_training` is true on the path that trains: no_grad there would break it
    message = _messages()[9]
    assert "volatile=is_training" in message
    assert "volatile=True" not in message
    assert "where gradients are not wanted" in message
