"""Object state in the scope interpreter: registered buffers, attributes other methods
reassign (first-call seeds), attributes holding bound methods (analysis/object_state.py,
scope_self.py)."""

from __future__ import annotations

from torchdoctor.check.analysis.values import Kind, Place

from .test_flow import HEADER, file_of

STATE = """
class Cell(nn.Module):
    def __init__(self, decay, rule="sub"):
        super().__init__()
        self.register_buffer("decay", torch.as_tensor(decay))
        self.register_buffer("empty", None)
        self.state = torch.zeros(1)
        if rule == "sub":
            self.step = self._step_sub
        else:
            self.step = self._step_plain

    def reset(self):
        self.state = torch.zeros_like(self.state, device=self.state.device)

    def scale(self, r):
        self.state = (1 - r) * self.state

    def forward(self, x):
        self.state = self.step(x)
        return self.state

    def _step_sub(self, x):
        return self._mix(x) - 1.0

    def _step_plain(self, x):
        return self._mix(x)

    def _mix(self, x):
        return self.decay * self.state + x
"""


def _scopes(source: str) -> dict[str, object]:
    ff = file_of(HEADER + source)
    return {f.name: ff.scope(f, callers=False) for f in ff.functions()}


def test_a_registered_buffer_is_on_the_module_device_in_its_methods() -> None:
    scopes = _scopes(STATE)
    mix = scopes["_mix"]
    decay = mix.seeds["self.decay"]  # type: ignore[attr-defined]
    assert decay.kind is Kind.TENSOR and decay.place is Place.DEVICE
    assert "self.empty" not in mix.seeds  # type: ignore[attr-defined]


def test_first_call_seed_where_the_other_writers_keep_the_cpu() -> None:
    scopes = _scopes(STATE)
    # `reset` and `scale` leave a CPU tensor where they find one; `forward` is the one
    # method that does not, so its own first call still finds what __init__ made
    state = scopes["forward"].seeds["self.state"]  # type: ignore[attr-defined]
    assert state.place is Place.CPU and state.line
    # `_mix` runs after `forward` has reassigned it: no seed
    assert "self.state" not in scopes["_mix"].seeds  # type: ignore[attr-defined]


def test_a_method_alias_runs_each_method_with_the_callers_self() -> None:
    forward = _scopes(STATE)["forward"]
    (m,) = forward.mismatches  # type: ignore[attr-defined]
    assert m.via == "call" and m.attribute == "self.state"
    assert forward.ctx.segment(m.cpu_node) == "self.step"  # type: ignore[attr-defined]


def test_a_meeting_in_one_alias_only_is_not_reported() -> None:
    source = STATE.replace("return self._mix(x)\n", "return x\n", 1)
    assert not _scopes(source)["forward"].mismatches  # type: ignore[attr-defined]


def test_two_writers_that_do_not_keep_it_leave_no_seed() -> None:
    source = STATE.replace("self.state = (1 - r) * self.state", "self.state = torch.zeros_like(r)")
    scopes = _scopes(source)
    assert "self.state" not in scopes["forward"].seeds  # type: ignore[attr-defined]
    assert not scopes["forward"].mismatches  # type: ignore[attr-defined]
