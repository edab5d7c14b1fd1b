"""Element types: numpy / torch dtypes <-> the library's enum cfx_dtype."""
from __future__ import annotations

import sys
from typing import Any

import numpy as np

# enum cfx_dtype (include/conflux/reduce.h)
F32, F64, F16, BF16, I32, I64, U8 = range(7)

#: Names accepted wherever a dtype is expected, beside numpy and torch dtypes.
NAMES = {
    "float32": F32, "float": F32, "f32": F32, "fp32": F32,
    "float64": F64, "double": F64, "f64": F64, "fp64": F64,
    "float16": F16, "half": F16, "f16": F16, "fp16": F16,
    "bfloat16": BF16, "bf16": BF16,
    "int32": I32, "i32": I32,
    "int64": I64, "i64": I64,
    "uint8": U8, "u8": U8,
}

SIZES = {F32: 4, F64: 8, F16: 2, BF16: 2, I32: 4, I64: 8, U8: 1}

_NP = {
    np.dtype(np.float32): F32, np.dtype(np.float64): F64, np.dtype(np.float16): F16,
    np.dtype(np.int32): I32, np.dtype(np.int64): I64, np.dtype(np.uint8): U8,
}

try:  # numpy has no bfloat16; ml_dtypes adds one when it is installed
    import ml_dtypes as _ml  # type: ignore

    NP_BFLOAT16: Any = np.dtype(_ml.bfloat16)
    _NP[NP_BFLOAT16] = BF16
except ImportError:  # pragma: no cover - depends on the environment
    NP_BFLOAT16 = None

OPS = {"sum": 0, "prod": 1, "min": 2, "max": 3}


def op_code(op: str | int) -> int:
    """enum cfx_redop of "sum", "prod", "min" or "max" (or the code itself).

    A bool is a TypeError: True would pass for code 1, "prod".
    """
    if isinstance(op, (bool, np.bool_)):
        raise TypeError(f"op must be one of {sorted(OPS)} (or its code 0-3), not {op!r}")
    if isinstance(op, int) and 0 <= op < 4:
        return op
    try:
        return OPS[str(op).lower()]
    except KeyError:
        raise ValueError(f"unknown reduction op {op!r}; one of {sorted(OPS)}") from None


def numpy_code(dt: np.dtype) -> int | None:
    """cfx dtype of a numpy dtype, or None when the library cannot reduce it."""
    return _NP.get(np.dtype(dt))


def dtype_code(dt: Any) -> int:
    """cfx dtype of a name, numpy dtype or torch dtype.

    None is a ValueError (a dtype is required); a dtype the library does not
    reduce is a TypeError, as for an array of that dtype.
    """
    if isinstance(dt, str) and dt.lower() in NAMES:
        return NAMES[dt.lower()]
    if dt is None:  # np.dtype(None) is float64: a default nobody asked for
        raise ValueError("dtype is required (float32, float64, float16, bfloat16, int32, "
                         "int64, uint8)")
    tcode = _torch_code(dt)
    if tcode is not None:
        return tcode
    try:
        code = _NP.get(np.dtype(dt))
    except TypeError:
        code = None
    if code is None:
        raise TypeError(f"dtype {dt!r} is not one the library reduces "
                         "(float32, float64, float16, bfloat16, int32, int64, uint8)")
    return code


def numpy_dtype(code: int) -> np.dtype:
    """numpy dtype of a cfx dtype (bfloat16: ml_dtypes' when present, else uint16 bits)."""
    if code == BF16:
        return NP_BFLOAT16 if NP_BFLOAT16 is not None else np.dtype(np.uint16)
    for k, v in _NP.items():
        if v == code:
            return k
    raise ValueError(f"unknown dtype code {code}")


def torch_numpy_dtype(dt: Any) -> np.dtype:
    """The numpy dtype a torch dtype's elements are seen as: itself where numpy
    has it (complex, int8 .. uint64, bool), ml_dtypes' bfloat16 or int16 bits
    for bfloat16, and an integer of the same size (the bits) for the rest
    (float8 kinds, complex32): one element each, so shapes stay as torch's."""
    torch = _torch_module()
    if dt == torch.bfloat16:
        return numpy_dtype(BF16)
    t = torch.empty(0, dtype=dt)
    try:
        return t.numpy().dtype
    except (TypeError, RuntimeError):
        return np.dtype(_BITS[t.element_size()])


_BITS = {1: np.uint8, 2: np.int16, 4: np.int32, 8: np.int64}


def _torch_code(dt: Any) -> int | None:
    torch = _torch_module()
    if torch is None or not isinstance(dt, torch.dtype):
        return None
    return {
        torch.float32: F32, torch.float64: F64, torch.float16: F16, torch.bfloat16: BF16,
        torch.int32: I32, torch.int64: I64, torch.uint8: U8,
    }.get(dt)


def _torch_module():
    import sys
    return sys.modules.get("torch")  # never imports torch: only a loaded one can be used


def as_array(x: Any, writable: bool = False) -> tuple[np.ndarray, int | None, bool]:
    """A numpy view sharing x's memory, x's cfx dtype (None: movable only), is-torch.

    Accepts numpy arrays, torch CPU tensors (bfloat16 included: seen as int16
    bits), and anything with the buffer protocol (bytes, bytearray, memoryview).
    """
    torch = _torch_module()
    if torch is not None and isinstance(x, torch.Tensor):
        if x.device.type != "cpu":
            raise ValueError(f"only CPU tensors are supported here, not {x.device}")
        if x.is_conj() or x.is_neg():
            # a lazy view: its memory holds the values before the conjugation
            # or negation, so it is neither read nor written as it is
            if writable:
                raise ValueError("the output tensor is a conjugated or negated view: pass a "
                                 "tensor of its own (x.resolve_conj() / resolve_neg())")
            x = x.resolve_conj().resolve_neg()
        if not x.is_contiguous():
            raise ValueError("the tensor must be contiguous")
        code = _torch_code(x.dtype)
        t = x.detach()
        if x.dtype == torch.bfloat16:
            arr = t.view(torch.int16).numpy()
        else:
            try:
                arr = t.numpy()  # every type numpy has, complex and uint16..64 included
            except (TypeError, RuntimeError):
                # float8 kinds, complex32: an integer of the element's size,
                # so the view keeps the tensor's shape and element count
                size = x.element_size()
                if size not in _BITS:
                    raise ValueError(f"torch dtype {x.dtype} ({size}-byte elements) "
                                     "cannot be moved") from None
                bits = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[size]
                arr = t.view(bits).numpy()
        return arr, code, True
    if isinstance(x, np.ndarray):
        arr = x
    else:
        arr = np.frombuffer(x, dtype=np.uint8) if not writable else np.asarray(memoryview(x)).view(np.uint8)
    if arr.dtype.hasobject:
        # its bytes are pointers to Python objects: moved, they would be
        # dangling in another process and uncounted references in this one
        raise TypeError(f"an array of dtype {arr.dtype} holds Python objects, not data: "
                        "it cannot be moved (pickle it into a bytes buffer instead)")
    if not arr.flags.c_contiguous:
        raise ValueError("the array must be C-contiguous")
    if writable and not arr.flags.writeable:
        # the likely cause where Ray runs, a distraction elsewhere
        ray = " (the arrays a Ray task is passed are read-only)" if "ray" in sys.modules else ""
        raise ValueError("the output array is read-only: pass a writable one, e.g. a copy "
                         f"np.array(x){ray}")
    return arr, numpy_code(arr.dtype), False
