"""What torch's APIs return and do: the vocabularies the scope interpreter looks names up in.

The lists live in `library.toml` beside this module (adding an API is one line there);
this module loads them once and gives each a name.
"""

from __future__ import annotations

import ast
import re
import sys
from importlib import resources

from torchdoctor.check.analysis.values import Kind, Place, Value

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

LIBRARY = tomllib.loads(
    (resources.files("torchdoctor.check.analysis") / "library.toml").read_text(encoding="utf-8")
)


def _names(table: str, key: str) -> frozenset[str]:
    return frozenset(LIBRARY[table][key])


FACTORIES = _names("torch", "factories")
# module class / torch function name -> argument positions that may be on any device
DEVICE_TOLERANT: dict[str, frozenset[int]] = {
    name: frozenset(positions)
    for name, positions in LIBRARY["modules"]["device_tolerant_arguments"].items()
}
# factories only in the overload given a size: `torch.normal(mean_t, std_t)` follows its tensors
SIZED_FACTORIES = _names("torch", "sized_factories")
LIKE_FACTORIES = _names("torch", "like_factories")
LEGACY_CONSTRUCTORS = _names("torch", "legacy_constructors")
IDENTITY_FUNCTIONS = _names("torch", "identity")
NUMPY_ARRAY_FACTORIES = _names("numpy", "array_factories")
NUMPY_CONVERTING = _names("numpy", "converting")
NUMPY_CONVERTING_MODULES = tuple(f"{m}." for m in LIBRARY["numpy"]["converting_modules"])
_MEETING_NAMESPACES = tuple(LIBRARY["torch"]["meeting_namespaces"])
_NON_MEETING_TORCH = _names("torch", "non_meeting")
MEETING_METHODS = _names("tensor", "meeting_methods")
PRESERVING_METHODS = _names("tensor", "preserving_methods")
REDUCTIONS = _names("tensor", "reductions")
_NON_TENSOR_METHODS = _names("tensor", "non_tensor_methods")
_TENSOR_ATTRS_SAME = _names("tensor", "same_place_attributes")
_TENSOR_META_ATTRS = _names("tensor", "meta_attributes")
_COMPARISONS = _names("tensor", "comparisons")
_INDEX_RESULTS = _names("tensor", "index_results")
DTYPE_NAMES = _names("tensor", "dtype_names")
_MODULE_SELF_METHODS = _names("modules", "self_returning_methods")
MODULE_ONLY_METHODS = _names("modules", "module_only_methods")
MODULE_OWN_METHODS = _names("modules", "own_methods")
MODULE_ONLY_SAVED_METHODS = _names("modules", "module_only_saved_methods")
PARAMETRISED_LAYERS = _names("modules", "parametrised_layers")
LIBRARY_MODULE_BASES = _names("modules", "library_module_bases")
_NON_MODULE_NN = _names("modules", "not_modules")
DATA_PARALLEL = _names("modules", "data_parallel")
MODULE_RETURNING = _names("modules", "module_returning")
_PASS_THROUGH_ITERATORS = _names("data", "pass_through_iterators")
_DEVICE_HOLDERS = _names("data", "device_holders")
STAR_CONVENTIONS: dict[str, str] = dict(LIBRARY["imports"]["star_conventions"])


_DEVICE_STRING = re.compile(r"^(cuda|mps|xpu|npu|hpu|xla|meta|privateuseone)(:\d+)?$")


# An iterable whose name says it yields batches.
_LOADERISH = re.compile(r"loader|(?:^|_)dl(?:$|_)|(?:^|_)batches$", re.IGNORECASE)


OPTIMIZER_PREFIX = "torch.optim."


_NOT_OPTIMIZERS = frozenset({"Optimizer", "lr_scheduler"})


_NO_GRAD_CONTEXTS = frozenset({"torch.no_grad", "torch.inference_mode"})


# Values that take the name of the variable they are first bound to (for messages).
_NAMED_KINDS = frozenset({Kind.LOADER, Kind.MODULE, Kind.DEVICE, Kind.DATASET})


def legacy_type_place(qual: str) -> Place | None:
    """Where a legacy tensor type puts tensors: `torch.cuda.FloatTensor` the device,
    `torch.FloatTensor` the CPU (None: not a typed legacy tensor type)."""
    head, _, last = qual.rpartition(".")
    if last == "Tensor" or last not in LEGACY_CONSTRUCTORS:
        return None  # (`torch.Tensor` is the class of every tensor, wherever it lives)
    if head == "torch.cuda":
        return Place.DEVICE
    return Place.CPU if head == "torch" else None


def is_dtype_text(text: str) -> bool:
    last = text.rsplit(".", 1)[-1]
    return "dtype" in text.lower() or (text.startswith("torch.") and last in DTYPE_NAMES)


def _trainable(module: Value) -> bool:
    """A module known to have trainable parameters: its outputs require grad."""
    if module.kind is not Kind.MODULE or module.is_input:
        return False
    return module.optimizer is not None or module.cls in PARAMETRISED_LAYERS


def is_cpu_name(value: object) -> bool:
    """`"cpu"`, `"cpu:0"`: a device string naming the CPU."""
    return isinstance(value, str) and (value == "cpu" or value.startswith("cpu:"))


def is_factory_call(call: ast.Call, last: str) -> bool:
    """`torch.<last>(...)` makes a new tensor: a factory, unless the function makes one
    only when given a size (`torch.normal(0.0, 1.0, (3,))`) and this call gives none: it
    then computes on its tensor arguments (`torch.normal(mean_t, std_t)`)."""
    return last in FACTORIES and (
        last not in SIZED_FACTORIES
        or len(call.args) >= 3
        or any(kw.arg == "size" for kw in call.keywords)
    )
