"""The syntactic gates that spare a rule a scope's analysis: a scope a gate turns away
holds nothing the rule would report from its analysis."""

from __future__ import annotations

from torchdoctor.check.analysis.syntax import dead_loop_rebinding
from torchdoctor.check.rules.td102_discarded_to import may_drop_a_move

from ._text_samples import fixture_texts
from .test_flow import file_of

_EXTRA = """
import torch

def dropped(x: torch.Tensor, ys):
    (x).to("cuda")
    x.type(torch.cuda.FloatTensor)
    for y in ys:
        y = y.cuda()

def kept(x: torch.Tensor):
    y = f(
        x.to("cuda"),
    )
    return x.to("cuda"), y
"""


def test_td102_gate_keeps_every_scope_with_a_reportable_move() -> None:
    turned_away = kept = 0
    for path, text in [*fixture_texts(), (None, _EXTRA)]:
        try:
            ff = file_of(text, getattr(path, "name", "extra.py"))
        except SyntaxError:
            continue
        for node in [ff.ctx.tree, *ff.functions()]:
            moves = ff.scope(node, callers=False).moves
            reportable = [m for m in moves if m.dropped or dead_loop_rebinding(node, m.call)]
            if may_drop_a_move(node):
                kept += bool(reportable)
            else:
                turned_away += 1
                assert not reportable, (path, getattr(node, "name", "<module>"))
    assert kept > 20 and turned_away > 500
    extra = file_of(_EXTRA, "extra.py")
    gate = {f.name: may_drop_a_move(f) for f in extra.functions()}
    assert gate == {"dropped": True, "kept": False}
    assert len(extra.scope(extra.functions()[1], callers=False).moves) == 2
