"""What torch's APIs return and do, as vocabularies the scope interpreter looks names up in."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING

from torchdoctor.check.analysis.values import Kind, Value

if TYPE_CHECKING:
    pass


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


FACTORIES = frozenset(
    {
        "zeros",
        "ones",
        "empty",
        "full",
        "rand",
        "randn",
        "randint",
        "randperm",
        "arange",
        "range",
        "linspace",
        "logspace",
        "eye",
        "tensor",
        "as_tensor",
        "from_numpy",
        "empty_strided",
        "tril_indices",
        "triu_indices",
        "bernoulli",
        "normal",
        "scalar_tensor",
        "complex",
        "polar",
    }
)


LIKE_FACTORIES = frozenset(
    {
        "zeros_like",
        "ones_like",
        "empty_like",
        "full_like",
        "rand_like",
        "randn_like",
        "randint_like",
    }
)


# torch.<x> namespaces whose functions compute on all their tensor arguments together.
_MEETING_NAMESPACES = ("torch.nn.functional.", "torch.linalg.", "torch.fft.", "torch.special.")


# torch functions that take several tensors without requiring one device.
_NON_MEETING_TORCH = frozenset(
    {
        "save",
        "load",
        "is_tensor",
        "is_floating_point",
        "numel",
        "manual_seed",
        "device",
        "Size",
        "set_grad_enabled",
        "no_grad",
        "enable_grad",
        "inference_mode",
        "broadcast_shapes",
        "result_type",
        "promote_types",
        "can_cast",
        "equal",
        "Generator",
        "compile",
    }
)


# Tensor methods that combine the receiver with tensor arguments (need one device).
MEETING_METHODS = frozenset(
    {
        "add",
        "add_",
        "sub",
        "sub_",
        "mul",
        "mul_",
        "div",
        "div_",
        "matmul",
        "mm",
        "bmm",
        "mv",
        "dot",
        "masked_fill",
        "masked_fill_",
        "masked_select",
        "masked_scatter",
        "masked_scatter_",
        "index_select",
        "index_add",
        "index_add_",
        "index_copy",
        "index_copy_",
        "index_put",
        "index_put_",
        "gather",
        "scatter",
        "scatter_",
        "scatter_add",
        "scatter_add_",
        "where",
        "eq",
        "ne",
        "lt",
        "le",
        "gt",
        "ge",
        "maximum",
        "minimum",
        "lerp",
        "lerp_",
        "addcmul",
        "addcmul_",
        "addcdiv",
        "addcdiv_",
        "pow",
        "pow_",
        "fmod",
        "remainder",
        "logical_and",
        "logical_or",
        "bitwise_and",
        "bitwise_or",
    }
)


# Tensor methods whose result is a tensor on the receiver's device.
PRESERVING_METHODS = frozenset(
    {
        "float",
        "double",
        "half",
        "bfloat16",
        "long",
        "int",
        "short",
        "bool",
        "byte",
        "char",
        "view",
        "view_as",
        "reshape",
        "reshape_as",
        "permute",
        "transpose",
        "t",
        "squeeze",
        "unsqueeze",
        "flatten",
        "unflatten",
        "contiguous",
        "clone",
        "expand",
        "expand_as",
        "repeat",
        "repeat_interleave",
        "tril",
        "triu",
        "abs",
        "exp",
        "log",
        "log1p",
        "sqrt",
        "rsqrt",
        "sigmoid",
        "tanh",
        "relu",
        "softmax",
        "log_softmax",
        "argmax",
        "argmin",
        "clamp",
        "clamp_",
        "clip",
        "round",
        "floor",
        "ceil",
        "neg",
        "logical_not",
        "cumsum",
        "cumprod",
        "flip",
        "roll",
        "narrow",
        "select",
        "index_fill",
        "fill_",
        "zero_",
        "normal_",
        "uniform_",
        "requires_grad_",
        "type",
        "sort",
        "topk",
        "chunk",
        "split",
        "unbind",
        "pin_memory",
        "masked_fill",
        "sign",
        "square",
        "pow",
    }
)


# Reductions: with no arguments the result is 0-dim (it mixes with any device).
REDUCTIONS = frozenset(
    {"sum", "mean", "max", "min", "prod", "norm", "std", "var", "all", "any", "amax", "amin"}
)


# Methods returning a Python value or metadata, not a tensor.
_NON_TENSOR_METHODS = frozenset(
    {"item", "tolist", "size", "dim", "numel", "nelement", "element_size", "stride"}
)


_TENSOR_ATTRS_SAME = frozenset({"T", "mT", "H", "mH", "real", "imag"})


_TENSOR_META_ATTRS = frozenset(
    {"shape", "dtype", "ndim", "is_cuda", "layout", "requires_grad", "is_leaf", "names"}
)


# Modules: methods that return the module itself.
_MODULE_SELF_METHODS = frozenset(
    {
        "eval",
        "train",
        "half",
        "float",
        "double",
        "bfloat16",
        "requires_grad_",
        "share_memory",
        "apply",
        "to_empty",
        "type",
    }
)


_DEVICE_STRING = re.compile(r"^(cuda|mps|xpu|npu|hpu|xla|meta|privateuseone)(:\d+)?$")


DTYPE_NAMES = frozenset(
    {
        "float",
        "float16",
        "float32",
        "float64",
        "half",
        "double",
        "bfloat16",
        "long",
        "int",
        "int8",
        "int16",
        "int32",
        "int64",
        "uint8",
        "bool",
        "complex64",
        "complex128",
        "cfloat",
        "cdouble",
        "short",
        "float8_e4m3fn",
        "float8_e5m2",
    }
)


# Wrappers a loop may put around a loader: the elements pass through.
_PASS_THROUGH_ITERATORS = frozenset({"tqdm", "iter", "tqdm_notebook", "track", "islice"})


# An iterable whose name says it yields batches.
_LOADERISH = re.compile(r"loader|(?:^|_)dl(?:$|_)|(?:^|_)batches$", re.IGNORECASE)


# Parameter-holding torch.nn layers (building one in forward creates fresh weights).
OPTIMIZER_PREFIX = "torch.optim."


_NOT_OPTIMIZERS = frozenset({"Optimizer", "lr_scheduler"})


DATA_PARALLEL = frozenset(
    {
        "torch.nn.DataParallel",
        "torch.nn.parallel.DataParallel",
        "torch.nn.parallel.data_parallel.DataParallel",
        "torch.nn.parallel.DistributedDataParallel",
        "torch.nn.parallel.distributed.DistributedDataParallel",
        "torch.nn.DistributedDataParallel",
    }
)


_NO_GRAD_CONTEXTS = frozenset({"torch.no_grad", "torch.inference_mode"})


# Values that take the name of the variable they are first bound to (for messages).
_NAMED_KINDS = frozenset({Kind.LOADER, Kind.MODULE, Kind.DEVICE, Kind.DATASET})


# Results that never require grad: booleans and indices.
_COMPARISONS = frozenset({"eq", "ne", "lt", "le", "gt", "ge", "logical_and", "logical_or"})


_INDEX_RESULTS = frozenset({"argmax", "argmin", "long", "int", "bool", "byte", "short", "char"})


# torch.nn layers that own parameters or buffers.
_LAYERS = """
    Linear Bilinear LazyLinear Conv1d Conv2d Conv3d ConvTranspose1d ConvTranspose2d
    ConvTranspose3d LazyConv1d LazyConv2d LazyConv3d BatchNorm1d BatchNorm2d BatchNorm3d
    SyncBatchNorm LayerNorm GroupNorm RMSNorm LocalResponseNorm Embedding EmbeddingBag RNN
    LSTM GRU RNNCell LSTMCell GRUCell MultiheadAttention Transformer TransformerEncoder
    TransformerDecoder TransformerEncoderLayer TransformerDecoderLayer PReLU
"""


PARAMETRISED_LAYERS = frozenset(_LAYERS.split())


# Objects that hold a target device (`args.device`, `self.device`, `model.device`);
# `x.device` of any other unknown `x` is wherever `x` happens to be.
_DEVICE_HOLDERS = _words(
    """self args cfg config conf opt opts options hparams params accelerator fabric trainer
    model module net pl_module state settings hps"""
)


_NON_MODULE_NN = frozenset(
    {"Parameter", "ParameterList", "ParameterDict", "UninitializedParameter"}
)


def is_dtype_text(text: str) -> bool:
    last = text.rsplit(".", 1)[-1]
    return "dtype" in text.lower() or (text.startswith("torch.") and last in DTYPE_NAMES)


def _trainable(module: Value) -> bool:
    """A module known to have trainable parameters: its outputs require grad."""
    if module.kind is not Kind.MODULE or module.is_input:
        return False
    return module.optimizer is not None or module.cls in PARAMETRISED_LAYERS
