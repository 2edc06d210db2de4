"""The model of the program that the static rules ask for facts.

Rules never walk the syntax tree for facts another function or file holds; they
ask one of two per-file objects, each built once per checked file and shared by
every rule (kept on the `FileContext`):

    from torchdoctor.check.analysis.file_flow import file_flow    # values and places
    from torchdoctor.check.analysis.file_loops import analysis    # training-loop structure

    ff = file_flow(ctx)
    for func in ff.functions():               # every def (methods, nested defs)
        if not ff.mentions(func, ".numpy("):  # cheap text gate: analyse relevant code only
            continue
        scope = ff.scope(func)                # a ScopeFlow, analysed on first request
        for call in scope.method_calls("numpy"):
            held = scope.value(call.func.value)   # a Value: what the receiver held there
            if held.place is Place.DEVICE: ...

    fl = analysis(ctx)
    for fi in fl.all_functions():             # FunctionInfo of every def
        for event in fl.events(fi): ...       # backward/step/zero_grad/... in program order
        modes = fl.modes(fi)                  # train/eval mode of every model, every path

What a scope records besides values: `mismatches` (a CPU tensor meets a device one;
`via="call"` when they meet inside a function of the file this call passes them to,
with `path`, `callee` and the `inner` mismatch), `moves`, `calls` (call sites, which
seed callee parameters), `conversions` (tensors NumPy converts implicitly). A call
of the file's own function is followed with what it passes (`FileFlow.call_facts`:
its result and the meetings inside; context-sensitive, depth 2, a budget per file).
What library APIs return is data: `library.toml`, loaded by `torch_api.py`.

Classes: a method's `self.m(...)` calls resolve in the class and its bases of the same file
(`FileIndex.inherited_methods`: a base's `forward` runs the subclass's `m`);
`reached_methods` / `call_chain` give what a method runs through such calls, to any depth.
Helpers only `__init__` runs (`FileIndex.init_helpers`: `self._init_state()`) are part of
construction: a call of one is followed with the arguments and `self` as they are there
(`call_facts(..., attributes)`, its `CallFacts.writes`), so `__init__`'s exit state, and
the `self.x` seeds of the other methods, hold what they make. A staticmethod called as
`self.m(...)` only (never through the class name) is seeded from those calls; a call of a
staticmethod through its class name (`Locator._score(a=x, b=y)`) is followed like a
function's, with what it passes. A method called on an object of a plain class
(`agent.act(obs)`, Kind.OBJECT) runs with what `__init__` left on it; where the class is
another project file's (`from agents import *`, `FileIndex.project_class`: a Kind.CLASS
value a name may hold), the method is read and followed in that file
(`FileFlow.foreign_method`, through `file_loops.project_file`: file_flow's one upward
import, acyclic since file_loops imports no scope or flow module). A call of another
project file's function (`from utils.progress import iterate_tqdm`, `utils.helper(x)`;
through one re-exporting package `__init__`) is followed there the same way
(`FileFlow.foreign_function`): its meetings are reported at the call, and its result
is one of the values the call passes (`tqdm(it)` or `it`), or a value it makes
(`made_results.py`: followed with what the call passes, or, passing nothing informative,
what it makes however it is called: `return model.to(get_device())`, loaders it builds,
a dict of modules it moves), carried with `where` naming that file for messages
(`Value.where_line`) and the caller's call as its node. A call passing nothing
informative reads the other file's text first: a function moving nothing is not parsed.

Values (`values.py`): a `Value` says what an expression holds: its `Kind` (module,
tensor, batch from a loader, loader, parameters, device, container, ...), its `Place`
(CPU, the target device, unknown) and where that came from. Anything not understood
is UNKNOWN, and rules stay quiet on UNKNOWN: the facts are proofs, not guesses.
Calling a value gives a module's output (a tensor where the module is) only when it is
shown to be an nn.Module: built from a module class, or used as one in the scope
(`model.eval()`, `.parameters()`, ...: `library.toml` [modules] module_only_methods).
An object merely moved with `.to(device)` may be a pipeline or a graph batch: calling
it gives UNKNOWN.

Parts, bottom to top (a module imports only modules listed before it; the
interpreters see the per-file objects above them only through protocols):

- `values`        the value lattice: Kind, Place, Value, join, Mismatch, Move, CallSite
- `default_path`  the path where a caller leaves out a None-default parameter: the CPU
                  values `if h is None: h = torch.zeros(n)` makes stay facts at the join
                  (`Value.default_of`), the given branch being unknown; likewise an
                  attribute `__init__` leaves None (`if self.feature_map is None:` in a
                  method: the object as built, before a setter runs)
- `unbound`       keys a scope has not bound before an `if` (a function's local names, a
                  plain `__init__`'s `self.x`): one branch that never binds one leaves it
                  unset, where a use raises, so the join keeps the other branch's value
- `dropped_device` classes whose `__init__` device defaults to CUDA (a project fact), and
                  calls that build one without the device their function was given (TD101)
- `torch_api`     vocabularies of torch's API: factories, device-preserving methods, layers
- `distributions` torch.distributions objects (`Kind.DISTRIBUTION`): where their parameter
                  tensors are; `kl_divergence(p, q)` and `d.log_prob(x)` are meetings
- `syntax`        questions about syntax alone: dotted names, bound names, decorators
- `interfaces`    protocols the scope interpreter and FunctionInfo see their file through
- `loop_passes`   a loop's second iteration, run from the state the first one leaves: when
                  it can meet something new, and which of its meetings stand (not under
                  `if i == 0:`, not in a loop over one element)
- `object_state` syntax of an object's state: the buffers a class registers, attributes
                  that hold one of several bound methods (`self.step = self._step_sub`)
- `collate`       whether a loader's `collate_fn=` (a function of the project that moves
                  nothing and calls nothing of the project) keeps its batches on the CPU
- `wrapped`       module-level names bound to a wrapped function of the file
                  (`f = cachetools.cached(cache)(_f)`, `typechecked(_f)`; library.toml
                  [wrappers]): a call of the name runs `_f` (flow, seeds, mode summaries);
                  through a cache only a tensor result's facts are kept
- `scope_core` < `scope_exprs` < `scope_library` < `scope_moves` < `scope_methods`
  < `scope_self` < `scope_calls` < `scope_objects` < `scope_loops` < `scope`
                  the scope interpreter (one function or module body), one layer per job:
                  state, expressions, library calls, tensor methods and moves, module calls
                  and methods, `self.m(...)` followed with the caller's `self` where it
                  carries a CPU tensor attribute (and `self.step(x)` of a bound-method
                  attribute), calls followed into functions, objects of plain classes
                  (the CPU tensors their construction stores, `Value.state`, run with
                  their methods; `a * b` dispatched to `__mul__`/`__rmul__`), loops run to
                  a fixpoint, statements
- `method_facts`  calls of a project module class's own methods from other files
                  (`model.read(images=batch)` on a moved model): the method's seeds, its
                  registered attributes where that model is (TD112 reports the meeting
                  in the method's file)
- `made_results` what another file's function makes that its caller may hold (a module
                  moved to a device its parameters do not choose, loaders, containers of
                  such) and the text gate that spares files moving nothing
- `file_index` < `flow_seeds` < `file_flow`   one file's functions and classes; the
                  seeding of parameters from call sites in the file and the project, and
                  of `self.x` (what `__init__` leaves; registered buffers, a base class's
                  in another project file too, on the device; an attribute other methods
                  reassign keeping it a CPU tensor, for a method's first call); the scope
                  cache and the calls followed into other files
- `project_facts` cross-file call facts (what other files pass to a function) and
                  `build_project`, the ProjectIndex of a whole run
- `text_facts`    the project facts read from a file's text before any parse (classes
                  that move data, NCCL starts, what files that zero gradients call)
- `path_guards`   what the `if` tests around a statement say (`self.task == "binary"`,
                  `if flag:`), and whether two such sets can hold at once: a value followed
                  from one method into another keeps only the branches that run together
- `settings`      an object's settings (`self.method`, `self.with_focal_loss`): tests on
                  different ones are independent, a combination is ruled out only by the
                  class (constants that fail a test, `if <combination>: raise`)
- `scope_index`   each module's and function's own nodes, calls and assignments, one
                  pass per file (the rules that look at calls scope by scope)
- `cpu_evidence`  where a scope shows a value can be on a device by bringing it to the
                  CPU elsewhere (`err.cpu().numpy()` ... `err.numpy()`), or the tensor it is
                  a part of (`w[i][0].cpu()` ... `w[i][0, 0]`, same subscripts)
- `wraps`         names that may hold a model wrapped in DataParallel/DDP (on some path),
                  functions that return one, calls that hand one to a parameter (same
                  file, and `ProjectIndex.wrapped_arguments_for` across files; TD404)
- `saved_objects` what a `torch.save` writes (NumPy arrays, namespaces, objects of the
                  project's classes) and a key for the file name, matched with loads in
                  other files (`ProjectIndex.saved_files_for`, built on demand; TD406)
- `cpu_saves`     whether a `torch.save` writes CPU tensors only (`x.cpu()`, or made in a
                  file that never names an accelerator), and the file it writes (through
                  `with open(path, "wb") as f`); recorded per save across files (TD402)
- `gpu_gates`     code that runs only where a GPU is (skip decorators on a test or its
                  class) or needs one anyway (GPU-only packages, torch.cuda APIs)
- `names`, `grad_contexts`, `events`, `functions`, `event_collector`: training-loop
                  vocabulary, no_grad/autocast contexts, events and their order; a call of
                  the file's function that runs backward() on a parameter is a backward
                  event of its argument (`Event.via`: a loop split across two functions)
- `loss_arguments` the torch loss an argument holds (`nn.CrossEntropyLoss()`, a name bound
                  to one, `F.cross_entropy`, a project function returning one given the
                  constants passed) and the calls of an imported function with the loss
                  each passes per slot (`ProjectIndex.loss_arguments_for`, built on demand
                  from the files that build or name a loss; TD301/TD302 read a parameter
                  called as a loss through it, rules/_loss_params.py)
- `overrides`     `self.m()` of an abstract method (`raise NotImplementedError`): the one
                  subclass definition of `m` in the project (`ProjectIndex.bases`,
                  `class_files`; `FileLoops.sole_override`, asked in evaluation code)
- `mode_state` < `mode_core` < `modes`   the train/eval mode interpreter and summaries
                  (what a callee leaves each model in, its evaluation runs, its training
                  steps, and its plain runs of a model it is given, which belong to the
                  caller's evaluation region and count as runs before the caller's backward())
- `module_paths`  which project file a dotted module means (beside the file; on request,
                  the one project file whose path ends like the dotted import:
                  `ProjectIndex.paths`), and the files a check depended on
- `loop_index` < `file_loops`   one file's training-loop facts, calls resolved to the
                  file's functions and to sibling modules it imports (`module_paths`)
- `class_calls`   methods looked up along a class's bases in the file (an inherited
                  method's `self.forward` is the subclass's), and the `self.m(...)` call
                  sites of a method with the class `self` is there
- `mode_intent`   whether a `model.train()` in evaluation code is deliberate (MC dropout,
                  a phase flag) and the `if is_train: ... else: model.eval()` of a function
                  serving both phases
- `kept_state`    objects that keep what their methods are given (`meter.update(loss)` adds
                  `loss` up in `self`'s state): the receiver's class where the code builds
                  it, its method read in the file or the project's file defining the class
                  (`ProjectIndex.class_files`, loaded on demand; TD206)
- `eval_branches` a module method's code that runs only in eval mode (`if not
                  self.training:`) and the layers the class builds that it runs there (TD202,
                  with `ProjectIndex.turns_grad_off` / `outside_calls`)
- `caller_backward` the calls `self.m(...)` in a class's family (other files too) whose
                  result goes to backward(): `m` returns a training step's loss (TD206)
- `graph_flow`    functions that give back a differentiable transform of a parameter
                  (`return attn.max(dim=1)[0].mean()`): their result has its graph (TD206)
- `pass_guards`   tests that hold on one pass of a loop only (`if i == 0:` on its counter,
                  or on `self.batch_index`, a copy the loop makes for the methods it calls)
- `inline_events` a function's events with the events of the file's functions it calls in
                  place of each call (`Event.site`): a training loop split across methods
"""
