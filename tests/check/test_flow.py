"""The per-function dataflow library (check/analysis/, the scope interpreter) on real snippets."""

from __future__ import annotations

import ast
import textwrap

from torchdoctor.check.analysis.file_flow import FileFlow, file_flow, scopes_with
from torchdoctor.check.analysis.project_facts import build_project
from torchdoctor.check.analysis.scope import ScopeFlow
from torchdoctor.check.analysis.values import UNKNOWN, Kind, Place, Value, join
from torchdoctor.check.context import FileContext
from torchdoctor.check.project import ProjectIndex

HEADER = """\
import torch
from torch import nn
from torch.utils.data import DataLoader

device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
"""


def file_of(source: str, path: str = "train.py", project: ProjectIndex | None = None) -> FileFlow:
    source = textwrap.dedent(source)
    tree = ast.parse(source)
    ctx = FileContext(path, source, tree, project or build_project([source]))
    return file_flow(ctx)


def scope(source: str, function: str | None = None) -> ScopeFlow:
    ff = file_of(HEADER + textwrap.dedent(source))
    if function is None:
        return ff.module_scope()
    (func,) = [f for f in ff.functions() if f.name == function]
    return ff.scope(func)


def value_of(sc: ScopeFlow, text: str, occurrence: int = -1, line: int = 0) -> Value:
    """The value of the `occurrence`-th expression (in source order) whose text is `text`."""
    nodes = sorted(
        (
            n
            for n in ast.walk(sc.node)
            if isinstance(n, ast.expr)
            and sc.ctx.segment(n) == text
            and sc.value(n) is not UNKNOWN
            and (not line or n.lineno == line)
        ),
        key=lambda n: (n.lineno, n.col_offset),
    )
    return sc.value(nodes[occurrence]) if nodes else UNKNOWN


# -- values and joins ----------------------------------------------------------------------


def test_join_keeps_what_both_paths_agree_on() -> None:
    moved = Value(Kind.TENSOR, Place.DEVICE, device="device", device_line=3)
    cpu = Value(Kind.TENSOR, Place.CPU, line=2)
    assert join(moved, moved) is moved
    joined = join(moved, cpu)
    assert joined.kind is Kind.TENSOR and joined.place is Place.UNKNOWN
    # a module on the device on one path, fresh (on the CPU) on the other: "maybe"
    module = Value(Kind.MODULE, Place.DEVICE, device="cuda", device_line=3)
    maybe = join(module, Value(Kind.MODULE, fresh=True))
    assert maybe.place is Place.DEVICE and maybe.maybe and maybe.device_line == 3
    assert join(Value(Kind.MODULE, fresh=True), module) == maybe
    assert join(moved, Value(Kind.MODULE)) is UNKNOWN
    # an empty container joined with a filled one keeps the filling (loops that append)
    module = Value(Kind.MODULE, fresh=True)
    filled = join(Value(Kind.CONTAINER), Value(Kind.CONTAINER, element=module))
    assert filled.element == module


# -- modules, moves and batches ------------------------------------------------------------


def test_module_moves_in_place_and_by_assignment() -> None:
    sc = scope(
        """
        a = nn.Linear(2, 2)
        a.to(device)
        b = nn.Linear(2, 2).to(device)
        c = nn.Linear(2, 2)
        c.to(torch.float16)
        """
    )
    a, b, c = sc.exit_env["a"], sc.exit_env["b"], sc.exit_env["c"]
    assert a.kind is Kind.MODULE and a.place is Place.DEVICE and a.device_line == 8
    assert b.kind is Kind.MODULE and b.place is Place.DEVICE and b.device == "device"
    assert c.place is Place.UNKNOWN and c.fresh  # a dtype conversion is not a move
    dropped = [m for m in sc.moves if m.dropped]
    assert len(dropped) == 2 and dropped[1].dtype_only


def test_batches_from_a_loader_and_their_parts() -> None:
    sc = scope(
        """
        loader = DataLoader(ds, batch_size=4)
        for i, (x, y) in enumerate(loader):
            pass
        for batch in loader:
            ids = batch["input_ids"]
            first, second = batch
        b0 = next(iter(loader))
        """
    )
    x = value_of(sc, "x")
    assert x.kind is Kind.BATCH and x.place is Place.CPU and x.name == "loader"
    assert x.line == 7 and x.pinned is False
    ids = value_of(sc, 'batch["input_ids"]')
    assert ids.kind is Kind.BATCH and ids.part
    assert value_of(sc, "second").kind is Kind.BATCH
    assert sc.exit_env["b0"].kind is Kind.BATCH and not sc.exit_env["b0"].part


def test_moves_through_assignment_comprehension_and_tuples() -> None:
    sc = scope(
        """
        loader = DataLoader(ds, pin_memory=True)
        for x, y in loader:
            x, y = x.to(device), y.cuda()
        for batch in loader:
            batch = {k: v.to(device) for k, v in batch.items()}
            inputs = batch["x"]
        for batch in loader:
            a, b = [t.to(device) for t in batch]
        """
    )
    assert value_of(sc, 'batch["x"]').place is Place.DEVICE
    assert value_of(sc, "b").place is Place.DEVICE
    assert value_of(sc, "x", 0).pinned is True
    assert "b" not in sc.exit_env  # bound only inside the loop, which may not run
    assert ("loader", 7) in sc.moved_origins


def test_dropped_tensor_move_leaves_the_tensor_where_it_was() -> None:
    sc = scope(
        """
        loader = DataLoader(ds)
        for x, y in loader:
            x.to(device)
            z = x
        """
    )
    z = value_of(sc, "z")
    assert z.place is Place.CPU and z.dropped_line == 9


def test_branches_join_and_unknown_helpers_forget() -> None:
    sc = scope(
        """
        def run(loader, use_cuda):
            net = nn.Linear(2, 2)
            if use_cuda:
                net.cuda()
            t = torch.zeros(3)
            if use_cuda:
                t = t.cuda()
            loader2 = DataLoader(ds)
            for batch in loader2:
                move_to(batch, device)
                seen = batch
            return net, t
        """,
        "run",
    )
    env = sc.exit_env
    # moved on one path only: on the device when `use_cuda`, on the CPU otherwise
    assert env["net"].kind is Kind.MODULE and env["net"].place is Place.DEVICE
    assert env["net"].maybe and not env["net"].fresh
    assert env["t"].kind is Kind.TENSOR and env["t"].place is Place.UNKNOWN
    assert "seen" not in env  # a dropped call of unknown effect may move the batch


def test_a_key_one_branch_never_binds_keeps_the_other_branch_value() -> None:
    # unset on the other path, a use raises: every use that runs sees the set value
    sc = scope(
        """
        def run(x, h, kind):
            if kind == "zeros":
                state = torch.zeros(3)
            if kind == "cuda":
                h = torch.zeros(3)
            if kind == "maybe":
                other = torch.zeros(3)
            else:
                other = make(kind)
            return x
        """,
        "run",
    )
    env = sc.exit_env
    assert env["state"].place is Place.CPU
    assert "h" not in env  # a parameter: the caller's value on the other path
    assert "other" not in env  # bound to something unknown on the other path


def test_a_maybe_unset_attribute_only_in_a_plain_init() -> None:
    ff = file_of(
        HEADER
        + """
class Grid(nn.Module):
    def __init__(self, kind):
        super().__init__()
        if kind == "sphere":
            self.points = torch.zeros(12, 3)
        if kind == "star":
            set_up(self)
        if kind == "cube":
            self.corners = torch.zeros(8, 3)


class Defaulted(nn.Module):
    points = None

    def __init__(self, kind):
        super().__init__()
        if kind == "sphere":
            self.points = torch.zeros(12, 3)
"""
    )
    grid, defaulted = (
        ff.scope(ff.methods(ff.classes[name])["__init__"]) for name in ("Grid", "Defaulted")
    )
    # `set_up(self)` may set anything: no attribute is known to be unset before it
    assert "self.points" not in grid.exit_env
    assert "self.points" not in defaulted.exit_env  # the class attribute otherwise


def test_global_names_are_never_unbound() -> None:
    sc = scope(
        """
        def run(kind):
            global cache
            if kind:
                cache = torch.zeros(3)
            if kind:
                local = torch.zeros(3)
            return kind
        """,
        "run",
    )
    assert "cache" not in sc.exit_env
    assert sc.exit_env["local"].place is Place.CPU


def test_early_return_and_continue_do_not_reach_the_join() -> None:
    sc = scope(
        """
        def f(flag):
            t = torch.zeros(2)
            if flag:
                t = t.to(device)
            else:
                return None
            for i in range(3):
                if i:
                    u = torch.ones(1)
                    continue
                u = torch.ones(1).to(device)
            return t
        """,
        "f",
    )
    (returned,) = [
        n.value
        for n in ast.walk(sc.node)
        if isinstance(n, ast.Return) and n.value and sc.ctx.segment(n.value) == "t"
    ]
    assert sc.value(returned).place is Place.DEVICE  # the CPU path returned early
    assert sc.returned is not None


def test_while_loop_reaches_a_fixpoint() -> None:
    sc = scope(
        """
        h = torch.zeros(2)
        while cond():
            out = h + 1
            h = h.to(device)
        """
    )
    # the first pass sees a CPU `h`, later passes a device `h`: at the loop head it is unknown
    assert value_of(sc, "h", line=9).place is Place.UNKNOWN


def test_grad_outside_and_inside_no_grad() -> None:
    sc = scope(
        """
        model = nn.Linear(4, 2).to(device)
        out = model(x.to(device))
        with torch.no_grad():
            quiet = model(x.to(device))
        w = torch.randn(3, requires_grad=True)
        d = w.detach()
        """
    )
    env = sc.exit_env
    assert env["out"].grad and env["out"].place is Place.DEVICE and env["out"].output
    assert not env["quiet"].grad
    assert env["w"].grad and not env["d"].grad


def test_mismatches_name_both_sides() -> None:
    sc = scope(
        """
        model = nn.Linear(4, 2).to(device)
        loader = DataLoader(ds)
        for x, y in loader:
            logits = model(x.to(device))
            loss = nn.functional.cross_entropy(logits, y)
            ok = logits + torch.tensor(1.0)
        """
    )
    (m,) = sc.mismatches
    assert sc.ctx.segment(m.cpu_node) == "y" and m.cpu.kind is Kind.BATCH
    assert sc.ctx.segment(m.other_node) == "logits" and m.other.output
    assert m.via == "torch"


# -- seeds: call sites, other files, self attributes, forward inputs ---------------------


def test_parameters_seeded_from_call_sites_in_the_same_file() -> None:
    ff = file_of(
        HEADER
        + """
def evaluate(model, loader):
    for x, y in loader:
        model(x)

def main():
    net = nn.Linear(4, 2).to(device)
    val = DataLoader(ds)
    evaluate(net, val)
"""
    )
    (evaluate,) = [f for f in ff.functions() if f.name == "evaluate"]
    sc = ff.scope(evaluate)
    assert sc.seeds["model"].place is Place.DEVICE
    loader = sc.seeds["loader"]
    assert loader.kind is Kind.LOADER and loader.name == "loader" and loader.alias == "val"
    (m,) = sc.mismatches
    assert sc.ctx.segment(m.cpu_node) == "x"


def test_no_seeds_when_the_function_escapes_or_callers_disagree() -> None:
    ff = file_of(
        HEADER
        + """
def evaluate(model, loader):
    for x, y in loader:
        model(x)

def main():
    net = nn.Linear(4, 2).to(device)
    evaluate(net, DataLoader(ds))
    evaluate(other_net, DataLoader(ds))
    callbacks = [evaluate]
"""
    )
    (evaluate,) = [f for f in ff.functions() if f.name == "evaluate"]
    assert ff.scope(evaluate).seeds == {}


def test_parameters_seeded_from_another_file() -> None:
    engine = "def evaluate(model, loader):\n    for x, y in loader:\n        model(x)\n"
    train = HEADER + (
        "from engine import evaluate\n"
        "model = nn.Linear(4, 2).to(device)\n"
        "val_loader = DataLoader(ds)\n"
        "evaluate(model, val_loader)\n"
    )
    project = build_project([("engine.py", engine), ("train.py", train)])
    assert [f.path for f in project.call_facts_for("evaluate", "engine.py")] == ["train.py"]
    ff = file_of(engine, "engine.py", project)
    sc = ff.scope(ff.functions()[0])
    assert sc.seeds["model"].where == "train.py" and sc.seeds["model"].device_line == 7
    assert sc.seeds["loader"].alias == "val_loader"
    assert len(sc.mismatches) == 1
    # the facts are part of the cache fingerprint
    assert project.fingerprint() != build_project([engine, HEADER]).fingerprint()


def test_methods_see_attributes_set_in_init() -> None:
    ff = file_of(
        HEADER
        + """
class Trainer:
    def __init__(self, model):
        self.model = model.to(device)
        self.loader = DataLoader(ds)

    def epoch(self):
        for x, y in self.loader:
            self.model(x)

class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc = nn.Linear(2, 2)
        self.table = torch.zeros(4)

    def forward(self, x, steps: int = 2):
        return self.fc(x) + self.table
"""
    )
    by_name = {f.name: f for f in ff.functions()}
    epoch = ff.scope(by_name["epoch"])
    assert epoch.seeds["self.loader"].kind is Kind.LOADER
    (m,) = epoch.mismatches
    assert epoch.ctx.segment(m.other_node) == "self.model"
    forward = ff.scope(by_name["forward"])
    assert forward.seeds["x"].is_input and forward.seeds["x"].place is Place.DEVICE
    assert "steps" not in forward.seeds  # an int flag is not a tensor input
    assert forward.seeds["self.fc"].place is Place.DEVICE  # registered: moves with the module
    (m,) = forward.mismatches
    assert forward.ctx.segment(m.cpu_node) == "self.table"


def test_queries_and_sharing() -> None:
    ff = file_of(HEADER + "y = x.to(device).numpy()\nz = torch.cat([a, b])\n")
    assert file_flow(ff.ctx) is ff
    sc = ff.module_scope()
    assert ff.module_scope() is sc
    assert len(sc.method_calls("numpy")) == 1 and len(sc.calls_named("to")) == 1
    assert len(sc.calls_named("cat")) == 1
    assert ff.mentions(ff.ctx.tree, ".numpy(") and not ff.mentions(ff.ctx.tree, "backward(")
    assert list(scopes_with(ff, "numpy")) == [ff.ctx.tree]


def test_deep_nesting_and_odd_syntax_do_not_crash() -> None:
    body = (
        "x = torch.zeros(1)\n"
        + "".join("    " * i + f"for i{i} in loader:\n" for i in range(12))
        + "    " * 12
        + "x = x.to(device)\n"
    )
    sc = scope(
        body
        + """
match command:
    case [a, *rest]:
        t = torch.ones(1)
    case _:
        pass
async def g():
    async with lock as l:
        await thing(l)
lam = lambda q: q.to(device)
try:
    w = torch.ones(1)
except* ValueError:
    pass
del w
"""
    )
    assert sc.exit_env.get("x") is None or sc.exit_env["x"].kind is Kind.TENSOR


def test_many_functions_use_one_index_of_calls() -> None:
    # past FileFlow.TEXT_SCANS names, call sites come from one walk of the tree
    count = FileFlow.TEXT_SCANS + 8
    source = HEADER + "net = nn.Linear(4, 2).to(device)\nval = DataLoader(ds)\n"
    for i in range(count):
        source += f"def run{i}(model, loader):\n    for x, y in loader:\n        model(x)\n"
        source += f"run{i}(net, val)\n"
    source += "callbacks = [run0, run39]\n"  # passed around as values: no seeds
    ff = file_of(source)
    by_name = {f.name: f for f in ff.functions()}
    for i in range(count):
        seeded = ff.scope(by_name[f"run{i}"]).seeds
        if i in (0, 39):
            assert seeded == {}
        else:
            assert seeded["model"].place is Place.DEVICE, i
    assert ff._uses_indexed


# -- calls followed with what they pass ------------------------------------------------------
def test_a_helper_returns_a_tensor_where_its_arguments_are() -> None:
    sc = scope(
        """
        def reduce_mean(out, target):
            return torch.abs(out - target).mean()

        x = torch.randn(4).to(device)
        loss = reduce_mean(x, x * 2)
        """
    )
    held = value_of(sc, "reduce_mean(x, x * 2)")
    assert (held.kind, held.place) == (Kind.TENSOR, Place.DEVICE)


def test_a_cpu_and_a_device_argument_meeting_in_a_helper_meet_at_the_call() -> None:
    sc = scope(
        """
        def combine(a, b):
            return torch.cat([a, b])

        x = torch.randn(4).to(device)
        both = combine(x, torch.zeros(4))
        apart = combine(x, x)
        """
    )
    (m,) = sc.mismatches
    assert m.via == "call" and m.site.lineno == 11  # type: ignore[attr-defined]
    assert "`combine` combines its `b`" in m.path and "(line 8)" in m.path


def test_recursive_helpers_end_and_stay_quiet() -> None:
    sc = scope(
        """
        def ping(a, b, n):
            return pong(b, a, n - 1) if n else a

        def pong(a, b, n):
            return ping(b, a, n - 1) if n else b

        x = torch.randn(4).to(device)
        y = ping(x, torch.zeros(4), 10)
        """
    )
    assert sc.mismatches == []  # nothing combines them; the recursion is cut, not followed


def test_legacy_tensor_types_move_what_they_retype() -> None:
    sc = scope(
        """
        cuda = torch.cuda.is_available()
        Tensor = torch.cuda.FloatTensor if cuda else torch.FloatTensor
        loader = DataLoader(data)
        for x, y in loader:
            a = x.type(Tensor)
            b = x.type(torch.cuda.FloatTensor)
            c = x.type(torch.DoubleTensor)
            d = x.type(torch.float16)
            e = x.type(kind)
            f = Tensor(4, 2)
            g = torch.cuda.LongTensor(3)
        """
    )
    run_time = value_of(sc, "a")
    assert run_time.place is Place.DEVICE and run_time.maybe
    assert value_of(sc, "b").place is Place.DEVICE
    assert value_of(sc, "c").place is Place.CPU
    assert value_of(sc, "d").place is Place.CPU  # a dtype: where the batch was
    assert value_of(sc, "e").place is Place.UNKNOWN  # a type we cannot know
    assert value_of(sc, "f").place is Place.DEVICE
    assert value_of(sc, "g").place is Place.DEVICE


def test_a_tensor_retyped_as_another_goes_where_that_one_is() -> None:
    sc = scope(
        """
        class Net(nn.Module):
            def forward(self, x):
                cpu = torch.zeros(4)
                on_x = torch.zeros(4).type(x.type())
                held = torch.ones(3).type(cpu.type())
                return on_x, held, torch.zeros(2).type(self.kind.type())
        """,
        "forward",
    )
    on_x = value_of(sc, "on_x")
    assert on_x.place is Place.DEVICE and on_x.device == "x.device"  # where the input is
    assert value_of(sc, "held").place is Place.CPU
    assert value_of(sc, "torch.zeros(2).type(self.kind.type())").place is Place.UNKNOWN


def test_factories_under_a_default_device_are_not_known_to_be_on_the_cpu() -> None:
    sc = scope(
        """
        def run(model):
            model.to(device)
            with torch.device(device):
                a = torch.randn(8, 3)
            b = torch.randn(8, 3)
            return model(a), model(b)
        """,
        "run",
    )
    assert value_of(sc, "a").place is Place.UNKNOWN
    assert value_of(sc, "b").place is Place.CPU


def test_no_meetings_where_the_code_expects_an_error() -> None:
    sc = scope(
        """
        def test_fails(model):
            model = nn.Linear(3, 2).to(device)
            with pytest.raises(RuntimeError):
                model(torch.randn(2, 3))
            model(torch.randn(2, 3))
        """,
        "test_fails",
    )
    (m,) = sc.mismatches
    assert m.site.lineno == sc.node.end_lineno  # the call after the block


def test_methods_of_instances_of_the_files_plain_classes_are_followed() -> None:
    ff = file_of(
        HEADER
        + textwrap.dedent(
            """
            class Ranker:
                def rank(self, query):
                    return query

            class Recommender:
                def __init__(self):
                    self.ranker = Ranker()

                def recommend(self, feature):
                    return self.ranker.rank(torch.Tensor(feature))
            """
        )
    )
    (rank,) = [f for f in ff.functions() if f.name == "rank"]
    seed = ff.scope(rank).seeds["query"]
    assert seed.kind is Kind.TENSOR and seed.place is Place.CPU
    (recommend,) = [f for f in ff.functions() if f.name == "recommend"]
    assert value_of(ff.scope(recommend), "self.ranker").kind is Kind.OBJECT


# -- torch.distributions objects --------------------------------------------------------


def test_a_distribution_is_where_its_parameter_tensors_are() -> None:
    sc = scope(
        """
        def prior(x):
            d = torch.distributions.Normal(torch.zeros(3), 1.0)
            draw = d.sample()
            standard = torch.distributions.Normal(0.0, 1.0)
            q = torch.distributions.Normal(x.to(device), 1.0)
            return torch.distributions.kl_divergence(q, d)
        """,
        "prior",
    )
    d = value_of(sc, "d")
    assert d.kind is Kind.DISTRIBUTION and d.place is Place.CPU
    draw = value_of(sc, "draw")
    assert draw.kind is Kind.TENSOR and draw.place is Place.CPU
    assert value_of(sc, "standard") is UNKNOWN  # numbers only: 0-dim CPU parameters
    assert value_of(sc, "q").place is Place.DEVICE
    assert [sc.ctx.segment(m.cpu_node) for m in sc.mismatches] == ["d"]
