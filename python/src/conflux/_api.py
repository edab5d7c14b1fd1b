"""Context, ObjectId, Group and ParameterServer: the Pythonic layer over _conflux."""
from __future__ import annotations

import ctypes
import functools
import math
import numbers
import operator
import os
import sys
import time
from typing import Any, Callable, Iterable, Sequence

import numpy as np

from . import _conflux as _c
from ._dtypes import (NAMES, SIZES, U8, as_array, dtype_code, numpy_dtype, op_code,
                      torch_numpy_dtype)

Buffer = Any  # numpy array, torch CPU tensor, or an object with the buffer protocol


#: The longest timeout the C layer takes (INT_MAX milliseconds), in seconds.
MAX_TIMEOUT = (2**31 - 1) / 1000.0


def _ms(timeout: float | None) -> int | None:
    """Seconds (float) -> milliseconds for the C layer; None keeps the default deadline.

    TypeError for what is not a number of seconds (a bool, a str); ValueError
    for a negative, infinite or NaN one, or one over MAX_TIMEOUT.
    """
    if timeout is None:
        return None
    if isinstance(timeout, bool) or not isinstance(timeout, numbers.Real):
        raise TypeError(f"timeout is a number of seconds, not {type(timeout).__name__} "
                        f"{timeout!r}")
    t = float(timeout)
    if not t >= 0 or math.isinf(t):
        raise ValueError("timeout is in seconds and must be finite and >= 0 "
                         "(every blocking call has a deadline)")
    ms = int(math.ceil(t * 1000.0))
    if ms > 2**31 - 1:
        raise ValueError(f"timeout must be between 0 and {MAX_TIMEOUT} s, not {timeout!r}")
    return ms


class ObjectId:
    """A 20-byte object id.  ``ObjectId.from_name("w")`` is the SHA-1 of the name."""

    __slots__ = ("_b",)

    def __init__(self, raw: bytes | bytearray | memoryview):
        if isinstance(raw, (str, numbers.Integral)):
            # bytes(20) would be twenty zero bytes: an id nobody meant
            raise TypeError(f"an object id is {_c.OBJECT_ID_LEN} bytes, not "
                            f"{type(raw).__name__} {raw!r} (ObjectId.from_name(str) "
                            "names one; ObjectId.from_hex(str) reads 40 hex digits)")
        b = bytes(raw)
        if len(b) != _c.OBJECT_ID_LEN:
            raise ValueError(f"an object id is {_c.OBJECT_ID_LEN} bytes, not {len(b)}")
        self._b = b

    @classmethod
    def from_name(cls, name: str) -> "ObjectId":
        """Id of a user-chosen name: same name, same id on every node."""
        if not isinstance(name, str):
            raise TypeError(f"an object name is a str, not {type(name).__name__}")
        return cls(_c.id_from_name(name))

    @classmethod
    def from_hex(cls, hex_: str) -> "ObjectId":
        """Id from 40 hex digits (conflux.InvalidError otherwise)."""
        return cls(_c.id_from_hex(hex_))

    @property
    def hex(self) -> str:
        return _c.id_to_hex(self._b)

    def __bytes__(self) -> bytes:
        return self._b

    def __eq__(self, other: object) -> bool:
        return isinstance(other, ObjectId) and other._b == self._b

    def __hash__(self) -> int:
        return hash(self._b)

    def __repr__(self) -> str:
        return f"ObjectId({self.hex!r})"

    def __str__(self) -> str:
        return self.hex


def _id(x: "ObjectId | str | bytes") -> bytes:
    if isinstance(x, ObjectId):
        return x._b
    if isinstance(x, str):
        return _c.id_from_name(x)
    if not isinstance(x, (bytes, bytearray, memoryview)):
        # said as what it is: an id ("cannot convert 'NoneType' object to bytes")
        raise TypeError(f"an object id is an ObjectId, a name (str) or "
                        f"{_c.OBJECT_ID_LEN} bytes, not {type(x).__name__} {x!r}")
    return ObjectId(x)._b


def _c_env_has_token() -> bool:
    """Whether the C environment (what exec passes on) still holds CFX_TOKEN."""
    getenv = ctypes.CDLL(None).getenv
    getenv.restype, getenv.argtypes = ctypes.c_char_p, [ctypes.c_char_p]
    return getenv(b"CFX_TOKEN") is not None


class Context(_c.Context):
    """One process's membership in a Conflux cluster.

    Unset arguments come from the CFX_* variables (cfx_run sets CFX_COORD and
    CFX_TOKEN_FILE)::

        with conflux.Context(coord="127.0.0.1:5000", token="t", timeout=30) as ctx:
            ctx.put("weights", arr)

    Args:
        coord: coordinator "host:port".
        token: the cluster token.
        transports: preference list, e.g. "shm,tcp".
        timeout: default deadline of blocking calls, in seconds.
        chunk_size: fixed chunk size in bytes (default follows the object size).
        name: node name shown by rdmactl, at most 63 bytes (else InvalidError).
        bind_addr: IP address the data plane listens on.
        secure: "off", "integrity" or "encrypt": seal control and tcp connections
            (default $CFX_SECURE, else off; every node and the coordinator must agree).

    close() (or leaving the ``with``) leaves the cluster; groups, parameter-server
    handles and arrays returned by get() keep the C context alive until they go.
    """

    def __init__(self, coord: str | None = None, token: str | None = None,
                 transports: str | None = None, timeout: float | None = None,
                 chunk_size: int = 0, name: str | None = None, bind_addr: str | None = None,
                 secure: str | None = None):
        super().__init__(coord=coord, token=token, transports=transports,
                         timeout_ms=_ms(timeout), chunk_size=chunk_size, name=name,
                         bind_addr=bind_addr, secure=secure)
        # The library took $CFX_TOKEN out of the process environment (children
        # must not inherit it); os.environ is Python's own copy, which
        # subprocess(env=dict(os.environ, ...)) would hand on: drop it too.
        if "CFX_TOKEN" in os.environ and not _c_env_has_token():
            del os.environ["CFX_TOKEN"]

    def __enter__(self) -> "Context":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def new_id(self) -> ObjectId:
        """A fresh id unique in the cluster."""
        return ObjectId(self.generate_id())

    def put(self, id: ObjectId | str, buffer: Buffer, *, timeout: float | None = None,
            chunk_size: int = 0, no_inline: bool = False) -> ObjectId:
        """Publish ``buffer`` (numpy array, torch CPU tensor, bytes...) as object ``id``.

        Zero-copy: the library serves the buffer's own memory, so it stays
        exported (numpy cannot resize it) and must not change until
        ``delete(id)``.  A str id is a name (ObjectId.from_name).
        Raises ExistsError when the id exists.
        """
        arr, _, _ = as_array(buffer)
        raw = _id(id)
        super().put(raw, arr, timeout_ms=_ms(timeout), chunk_size=chunk_size,
                    no_inline=no_inline)
        return ObjectId(raw)

    def get(self, id: ObjectId | str, out: Buffer | None = None, *,
            timeout: float | None = None, dtype: Any = None,
            shape: Sequence[int] | int | None = None) -> Any:
        """Fetch object ``id``; wait for a holder until the deadline.

        With ``out`` (a writable numpy array, torch CPU tensor or buffer) the
        bytes land there and ``out`` is returned (when the object is smaller
        than ``out``, a uint8 view of its bytes is returned instead); ``out``
        is the caller's to change or free once this returns (this node keeps
        no copy in it, so it serves the object to nobody after).
        Without, a new numpy array over registered arena memory is returned
        (no copy): uint8, or ``dtype`` (numpy/torch dtype or name) and
        ``shape``; this node serves the object from it until ``delete(id)``,
        so it must not be changed.  ``dtype`` and ``shape`` go without
        ``out`` only (TypeError with it, or for a dtype of Python objects).
        Raises TimeoutError (conflux), TruncatedError when ``out`` is too small.
        """
        raw = _id(id)
        if out is not None:
            if dtype is not None or shape is not None:
                # they were ignored: the bytes land in out as out's own type
                raise TypeError("get: dtype and shape describe the array get() makes; "
                                "with out= the object lands in out as out's type")
            arr, _, _ = as_array(out, writable=True)
            n = self.get_into(raw, arr, timeout_ms=_ms(timeout))
            if n == arr.nbytes:
                return out
            return arr.reshape(-1).view(np.uint8)[:n]
        # the dtype is checked before the fetch, which makes this node a holder
        dt = None if dtype is None else _np_dtype(dtype)
        if dt is not None and dt.hasobject:
            raise TypeError(f"get: dtype {dt} holds Python objects, not data: an object's "
                            "bytes cannot be read as one")
        buf = self.get_alloc(raw, timeout_ms=_ms(timeout))
        a = np.frombuffer(buf, dtype=np.uint8)
        try:
            if dt is not None:
                a = a.view(dt)
            if shape is not None:
                a = a.reshape(shape)
        except ValueError as e:  # numpy's words name neither the object nor its size
            want = f"{dt or 'uint8'}" + (f" of shape {shape}" if shape is not None else "")
            raise ValueError(f"get: object {id!r} has {a.nbytes} bytes, which do not make "
                             f"an array of {want} ({e})") from None
        return a

    def get_nb(self, id: ObjectId | str, out: Buffer, *,
               timeout: float | None = None) -> Any:
        """Start fetching object ``id`` into ``out`` and return at once.

        Returns a request: ``wait(timeout_ms=None)`` and ``test()`` as for a
        collective's, and ``progress()`` -> ``(done, total)``, the bytes landed
        in order in ``out`` so far of the object's size (``total`` None until
        a source gave the size).  ``out`` stays exported until the request
        completes, then is the caller's (this node keeps no copy in it).  A
        request dropped unfinished cancels the get: it is withdrawn before
        the drop returns, and nothing lands in ``out`` after.
        """
        arr, _, _ = as_array(out, writable=True)
        return super().get_nb(_id(id), arr, timeout_ms=_ms(timeout))

    def delete(self, id: ObjectId | str, *, timeout: float | None = None) -> None:
        """Stop holding ``id`` here; the putter's delete ends the object everywhere.

        The put buffer is released (back to the caller) when this returns.
        """
        super().delete(_id(id), timeout_ms=_ms(timeout))

    def reduce_objects(self, inputs: Iterable[ObjectId | str], result: ObjectId | str, *,
                       dtype: Any, op: str = "sum", k: int | None = None,
                       timeout: float | None = None,
                       nodes: Iterable[int] | None = None,
                       allreduce: bool = False) -> list[int]:
        """result = op over the first ``k`` (default all) ``inputs`` to become ready.

        The reduction runs between the inputs' holders, chunk by chunk; any
        node may then ``get(result)``.  The result is produced on a holder of
        one of the inputs reduced: the one the coordinator's placement
        chooses (this node when it holds one), or one of ``nodes`` (node
        ids, see ``Context.node_id``); none of them holding an input ready
        raises ``conflux.Error`` with status ``CFX_ERR_NO_RESOURCE``.
        Inputs of up to 64 KiB put without ``no_inline`` are kept by the
        coordinator and fetched by this node, which then holds them (so
        ``nodes`` must name it).
        With ``allreduce=True`` every holder of an input reads the result:
        over nodes of more than one host (all inputs, no ``nodes``) it is
        reduced in stripes and each holder ends with a copy of its own, so
        its ``get(result)`` is local (``CFX_OBJ_FLAG_ALLREDUCE`` in
        conflux/object.h).
        Returns the indices of the inputs reduced, in the order they became
        ready.
        """
        ids = [_id(x) for x in inputs]
        return super().reduce_objects(ids, len(ids) if k is None else k, dtype_code(dtype),
                                      op_code(op), _id(result), timeout_ms=_ms(timeout),
                                      nodes=None if nodes is None else list(nodes),
                                      allreduce=allreduce)


def _np_dtype(dt: Any) -> np.dtype:
    if isinstance(dt, str) and dt.lower() in NAMES:
        return numpy_dtype(NAMES[dt.lower()])
    torch = sys.modules.get("torch")
    if torch is not None and isinstance(dt, torch.dtype):
        return torch_numpy_dtype(dt)  # any torch dtype: a get moves bytes
    try:
        return np.dtype(dt)
    except TypeError:
        raise ValueError(f"{dt!r} is not a numpy or torch dtype or a dtype name") from None


def _dtype_name(x: Any, arr: np.ndarray) -> str | None:
    """Element type of a numpy array or torch tensor as one name for both
    ("float32", "bfloat16"; a non-native byte order as numpy spells it,
    ">f4"); None for a plain buffer, which has bytes, not a type."""
    if isinstance(x, np.ndarray):
        return arr.dtype.name if arr.dtype.isnative else arr.dtype.str
    dt = getattr(x, "dtype", None)
    if dt is not None and type(x).__module__.startswith("torch"):
        return str(dt).replace("torch.", "")
    return None


_ALGOS = {"auto": 0, "ring": 1, "tree": 2, "chain": 3, "dbtree": 4, "rhd": 5, "direct": 6,
          "recdbl": 7}


def _like(x: Any, arr: np.ndarray, is_torch: bool, shape: tuple[int, ...]) -> tuple[Any, np.ndarray]:
    """A new output of x's kind (numpy or torch) and dtype with ``shape``; plus its numpy view."""
    if is_torch:
        import torch
        t = torch.empty(shape, dtype=x.dtype)
        return t, as_array(t, writable=True)[0]
    a = np.empty(shape, dtype=arr.dtype)
    return a, a


class Work:
    """A non-blocking collective (``async_op=True``): ``wait()`` returns its result.

    Its buffers stay exported until it completes: do not touch them before.
    Collectives of a group run in the order they were posted.
    """

    __slots__ = ("_req", "_result")

    def __init__(self, req: Any, result: Any):
        self._req, self._result = req, result

    def wait(self, timeout: float | None = None) -> Any:
        """Until complete (raises its error; conflux.TimeoutError leaves it running).

        On the main thread Ctrl-C ends the wait within about 0.1 s
        (KeyboardInterrupt), leaving the operation running too.
        """
        self._req.wait(timeout_ms=_ms(timeout))
        return self._result

    def is_completed(self) -> bool:
        """True once complete (raises its error if it failed)."""
        return self._req.test()


def _takes_turn(kind: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """A collective this module refuses before it reaches the library (a
    read-only output, a dtype, a timeout, an interrupt...) still takes its
    turn in the group's call order, and the other ranks hear of the refusal
    at once, as for a call the library refuses itself: else this rank's
    next call paired with the other ranks' this one, and one of the same
    arguments reduced the wrong data without an error."""
    def deco(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def call(self: "Group", *args: Any, **kwargs: Any) -> Any:
            turns = self._turns
            try:
                return fn(self, *args, **kwargs)
            except BaseException:
                if self._turns == turns:  # it never reached the library
                    self._refuse(kind, bool(kwargs.get("async_op", False)))
                raise
        return call
    return deco


class Group(_c.Group):
    """A fixed set of ranks 0..size-1 running collectives on numpy arrays and torch CPU tensors.

    Rank and size default to the launcher's variables (cfx_run, Open MPI,
    Slurm, torchrun).  Every rank calls the same collectives in the same
    order with matching arguments.  Reductions take float32, float64,
    float16, bfloat16 (torch.bfloat16 or ml_dtypes.bfloat16), int32, int64
    and uint8; the data-movement collectives take any dtype.  ``op`` is
    "sum", "prod", "min" or "max"; ``timeout`` is seconds; ``algo`` forces an
    algorithm ("ring", "tree", "chain", "dbtree", "rhd", "direct", "recdbl").

    Calls release the GIL while they wait; one group is used by one thread at
    a time (other threads wait for it).
    """

    def __init__(self, context: Context, name: str | None = None, *, rank: int | None = None,
                 size: int | None = None, timeout: float | None = None):
        for what, v in (("rank", rank), ("size", size)):
            if isinstance(v, (bool, np.bool_)):  # True would pass for rank or size 1
                raise TypeError(f"{what} must be an int, not {v!r}")
        super().__init__(context, name=name, rank=rank, size=size, timeout_ms=_ms(timeout))
        self.context = context

    def __enter__(self) -> "Group":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # -- helpers
    @staticmethod
    def _red(x: Any, writable: bool = True) -> tuple[np.ndarray, int, bool]:
        arr, code, is_t = as_array(x, writable=writable)
        if code is None:
            raise TypeError(f"dtype {getattr(x, 'dtype', type(x))} cannot be reduced; "
                            "use float32/64/16, bfloat16, int32, int64 or uint8")
        return arr, code, is_t

    @staticmethod
    def _mov(x: Any, writable: bool = True) -> tuple[np.ndarray, int, int, bool]:
        """For data movement: (array, dtype code, element count, is_torch); unknown dtypes move as bytes."""
        arr, code, is_t = as_array(x, writable=writable)
        if code is None:
            return arr, U8, arr.nbytes, is_t
        return arr, code, arr.nbytes // SIZES[code], is_t

    @staticmethod
    def _check_out(out: Any, out_arr: np.ndarray, src: Any, src_arr: np.ndarray, nbytes: int,
                   what: str, names: tuple[str, str] = ("out", "the input")) -> None:
        """``out`` must hold ``nbytes`` (ValueError) of ``src``'s element type (TypeError).

        The types are compared when both are typed (numpy arrays, torch
        tensors; a torch and a numpy type of the same name match); a plain
        buffer (bytearray, memoryview...) is bytes and takes any type.
        """
        so, ss = _dtype_name(out, out_arr), _dtype_name(src, src_arr)
        if so is not None and ss is not None and so != ss:
            raise TypeError(f"{what}: {names[0]} has dtype {so}, {names[1]} {ss}; "
                            "they must be the same")
        if out_arr.nbytes != nbytes:
            raise ValueError(f"{what}: {names[0]} has {out_arr.nbytes} bytes, needs {nbytes}")

    def _kw(self, timeout: float | None, algo: str | int | None) -> dict[str, Any]:
        if algo is None:
            a = 0
        elif isinstance(algo, str):
            a = _ALGOS.get(algo, -1)
            if a < 0:
                raise ValueError(f"unknown algorithm {algo!r}; one of {', '.join(_ALGOS)}")
        elif isinstance(algo, numbers.Integral) and not isinstance(algo, bool):
            a = int(algo)  # a code; the C layer checks its range
        else:
            raise ValueError(f"algo is a name ({', '.join(_ALGOS)}), not {algo!r}")
        return {"timeout_ms": _ms(timeout), "algo": a}

    # -- collectives
    @_takes_turn("allreduce")
    def allreduce(self, tensor: Any, op: str = "sum", *, out: Any = None,
                  timeout: float | None = None, algo: str | None = None,
                  async_op: bool = False) -> Any:
        """Element-wise ``op`` over ranks; in place unless ``out`` is given.  Returns the result.

        With ``async_op=True`` it returns a Work at once (also for broadcast,
        reduce and allgather); ``work.wait()`` returns the result.
        """
        arr, code, _ = self._red(tensor, writable=out is None)
        dst = arr
        if out is not None:
            dst = self._red(out)[0]
            self._check_out(out, dst, tensor, arr, arr.nbytes, "allreduce")
        args = (arr, dst, arr.nbytes // SIZES[code], code, op_code(op))
        res = tensor if out is None else out
        if async_op:
            return Work(super().iallreduce(*args, **self._kw(timeout, algo)), res)
        super().allreduce(*args, **self._kw(timeout, algo))
        return res

    @_takes_turn("broadcast")
    def broadcast(self, tensor: Any, root: int = 0, *, timeout: float | None = None,
                  algo: str | None = None, async_op: bool = False) -> Any:
        """Root's ``tensor`` to every rank, in place."""
        root = _rank(root, "root")
        arr, code, count, _ = self._mov(tensor)
        kw = dict(recv=arr, count=count, dtype=code, root=root, **self._kw(timeout, algo))
        if async_op:
            return Work(super().ibroadcast(**kw), tensor)
        super().broadcast(**kw)
        return tensor

    @_takes_turn("reduce")
    def reduce(self, tensor: Any, root: int = 0, op: str = "sum", *, out: Any = None,
               timeout: float | None = None, algo: str | None = None,
               async_op: bool = False) -> Any:
        """``op`` over ranks into root's ``out`` (or root's ``tensor``, in place).

        Returns the result at root, None elsewhere.
        """
        root = _rank(root, "root")
        arr, code, _ = self._red(tensor, writable=out is None and self.rank == root)
        dst = None
        if self.rank == root:
            dst = arr
            if out is not None:
                dst = self._red(out)[0]
                self._check_out(out, dst, tensor, arr, arr.nbytes, "reduce")
        args = (arr, dst, arr.nbytes // SIZES[code], code, op_code(op), root)
        res = None if self.rank != root else (tensor if out is None else out)
        if async_op:
            return Work(super().ireduce(*args, **self._kw(timeout, algo)), res)
        super().reduce(*args, **self._kw(timeout, algo))
        return res

    @_takes_turn("allgather")
    def allgather(self, tensor: Any, *, out: Any = None, timeout: float | None = None,
                  algo: str | None = None, async_op: bool = False) -> Any:
        """Every rank's ``tensor`` stacked: result shape (size, *tensor.shape)."""
        arr, code, count, is_t = self._mov(tensor, writable=False)
        if out is None:
            out, dst = _like(tensor, arr, is_t, (self.size, *arr.shape))
        else:
            dst = as_array(out, writable=True)[0]
        self._check_out(out, dst, tensor, arr, arr.nbytes * self.size, "allgather")
        if async_op:
            return Work(super().iallgather(arr, dst, count, code, **self._kw(timeout, algo)), out)
        super().allgather(arr, dst, count, code, **self._kw(timeout, algo))
        return out

    @_takes_turn("reduce_scatter")
    def reduce_scatter(self, tensor: Any, op: str = "sum", *, out: Any = None,
                       timeout: float | None = None, algo: str | None = None) -> Any:
        """Block ``rank`` of ``op`` over ranks; ``tensor`` holds size blocks (first axis or flat)."""
        arr, code, is_t = self._red(tensor, writable=False)
        total = arr.nbytes // SIZES[code]
        if total % self.size:
            raise ValueError(f"reduce_scatter: {total} elements do not split into {self.size} blocks")
        count = total // self.size
        if out is None:
            shape = arr.shape[1:] if arr.ndim > 1 and arr.shape[0] == self.size else (count,)
            out, dst = _like(tensor, arr, is_t, tuple(shape))
        else:
            dst = self._red(out)[0]
        self._check_out(out, dst, tensor, arr, count * SIZES[code], "reduce_scatter")
        super().reduce_scatter(arr, dst, count, code, op_code(op), **self._kw(timeout, algo))
        return out

    @_takes_turn("alltoall")
    def alltoall(self, tensor: Any, *, out: Any = None, timeout: float | None = None,
                 algo: str | None = None) -> Any:
        """Block r of this rank's ``tensor`` goes to rank r; block q of the result came from q."""
        arr, code, total, is_t = self._mov(tensor, writable=False)
        if total % self.size:
            raise ValueError(f"alltoall: {total} elements do not split into {self.size} blocks")
        if out is None:
            out, dst = _like(tensor, arr, is_t, arr.shape)
        else:
            dst = as_array(out, writable=True)[0]
        self._check_out(out, dst, tensor, arr, arr.nbytes, "alltoall")
        super().alltoall(arr, dst, total // self.size, code, **self._kw(timeout, algo))
        return out

    @_takes_turn("gather")
    def gather(self, tensor: Any, root: int = 0, *, out: Any = None,
               timeout: float | None = None, algo: str | None = None) -> Any:
        """Every rank's ``tensor`` stacked at root (shape (size, *shape)); None elsewhere."""
        root = _rank(root, "root")
        arr, code, count, is_t = self._mov(tensor, writable=False)
        dst = None
        if self.rank == root:
            if out is None:
                out, dst = _like(tensor, arr, is_t, (self.size, *arr.shape))
            else:
                dst = as_array(out, writable=True)[0]
            self._check_out(out, dst, tensor, arr, arr.nbytes * self.size, "gather")
        super().gather(arr, dst, count, code, root=root, **self._kw(timeout, algo))
        return out if self.rank == root else None

    @_takes_turn("scatter")
    def scatter(self, out: Any, tensor: Any = None, root: int = 0, *,
                timeout: float | None = None, algo: str | None = None) -> Any:
        """Block r of root's ``tensor`` (size blocks) into rank r's ``out``.  Returns ``out``."""
        root = _rank(root, "root")
        dst, code, count, _ = self._mov(out)
        src = None
        if self.rank == root:
            if tensor is None:
                raise ValueError("scatter: the root passes the tensor to scatter")
            src = as_array(tensor)[0]
            self._check_out(tensor, src, out, dst, dst.nbytes * self.size, "scatter",
                            ("the root's tensor", "out"))
        super().scatter(src, dst, count, code, root=root, **self._kw(timeout, algo))
        return out

    def send(self, tensor: Any, peer: int, tag: int = 0, *, timeout: float | None = None) -> None:
        """Send ``tensor`` to rank ``peer``; matched in order with the peer's recv of the same tag."""
        peer, tag = _rank(peer, "peer"), _tag(tag)
        arr, code, count, _ = self._mov(tensor, writable=False)
        super().send(send=arr, count=count, dtype=code, root=peer, tag=tag,
                     timeout_ms=_ms(timeout))

    def recv(self, tensor: Any, peer: int, tag: int = 0, *, timeout: float | None = None) -> Any:
        """Receive from rank ``peer`` into ``tensor`` (sizes must agree).  Returns ``tensor``."""
        peer, tag = _rank(peer, "peer"), _tag(tag)
        arr, code, count, _ = self._mov(tensor)
        super().recv(recv=arr, count=count, dtype=code, root=peer, tag=tag,
                     timeout_ms=_ms(timeout))
        return tensor

    @_takes_turn("barrier")
    def barrier(self, *, timeout: float | None = None) -> None:
        """Wait until every rank has called barrier()."""
        super().barrier(timeout_ms=_ms(timeout))


_ROLES = {"worker": 0, "server": 1}
_CONSISTENCY = {"bsp": 0, "ssp": 1, "asp": 2}
_OPTIMIZERS = {"sum": 0, "sgd": 1, "momentum": 2, "adam": 3}


_C_INT_MIN, _C_INT_MAX = -(2**31), 2**31 - 1


def _c_int(v: Any, what: str, kind: str) -> int:
    """An int argument bound for a C int: an integer, numpy's too; not a bool (which
    would pass for 0 or 1); one past a C int is a ValueError naming it."""
    if isinstance(v, (bool, np.bool_)):
        raise TypeError(f"{what} must be {kind}, not {v!r}")
    try:
        r = operator.index(v)
    except TypeError:
        raise TypeError(f"{what} must be {kind}, not {type(v).__name__}") from None
    if not _C_INT_MIN <= r <= _C_INT_MAX:
        rule = "0 <= rank < the group's size" if what != "tag" else "-2**31 <= tag < 2**31"
        raise ValueError(f"{what} {r} is out of range: {rule}")
    return r


def _rank(v: Any, what: str) -> int:
    """A rank argument (root, peer); the C layer judges it against the group's size."""
    return _c_int(v, what, "a rank (an int)")


def _tag(v: Any) -> int:
    """A message tag: any C int."""
    return _c_int(v, "tag", "an int")


def _choice(what: str, value: str, table: dict[str, int]) -> int:
    """table[value], or a ValueError that lists the choices (not a bare KeyError)."""
    if not isinstance(value, str) or value not in table:
        raise ValueError(f"unknown {what} {value!r}; one of {', '.join(table)}")
    return table[value]


class ParameterServer(_c.ParameterServer):
    """Client of Conflux's parameter server (include/conflux/ps.h).

    A worker registers tensors and pushes gradients / pulls parameters; a
    server calls serve() until the job ends.  Server 0's settings
    (consistency, optimizer, lr...) are the job's.  One role per context.
    """

    def __init__(self, context: Context, job: str = "ps", *, role: str = "worker", index: int = 0,
                 num_workers: int = 1, num_servers: int = 1, consistency: str = "bsp",
                 staleness: int = 1, block_size: int = 0, optimizer: str = "sum",
                 lr: float = 0.01, momentum: float = 0.9, beta1: float = 0.9,
                 beta2: float = 0.999, eps: float = 1e-8, weight_decay: float = 0.0,
                 grad_scale: float = 1.0, timeout: float | None = None):
        super().__init__(context, job=job, role=_choice("role", role, _ROLES), index=index,
                         num_workers=num_workers, num_servers=num_servers,
                         consistency=_choice("consistency", consistency, _CONSISTENCY),
                         staleness=staleness, block_size=block_size,
                         optimizer=_choice("optimizer", optimizer, _OPTIMIZERS), lr=lr,
                         momentum=momentum, beta1=beta1, beta2=beta2, eps=eps,
                         weight_decay=weight_decay, grad_scale=grad_scale,
                         timeout_ms=_ms(timeout))
        self.context = context
        self._shapes: dict[int, tuple[tuple[int, ...], int]] = {}

    def __enter__(self) -> "ParameterServer":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def serve(self, timeout: float | None = None) -> None:
        """Server: serve until the job ends (returns) or ``timeout`` seconds pass (TimeoutError).

        ``None``: until the job ends.  It waits in slices of at most 0.2 s, so
        Ctrl-C (KeyboardInterrupt) ends it within one; the server keeps
        serving in the background until ``close()``.
        """
        ms = _ms(timeout)
        end = None if ms is None else time.monotonic() + ms / 1000.0
        while True:
            left = 200 if end is None else math.ceil((end - time.monotonic()) * 1000.0)
            try:
                super().serve(max(0, min(200, left)))
                return
            except TimeoutError:
                if end is not None and time.monotonic() >= end:
                    raise

    def register(self, name: str, init: Any = None, *, dtype: Any = None,
                 shape: Sequence[int] | int | None = None) -> int:
        """Register a tensor on every worker (worker 0's ``init`` gives its values); returns its key.

        Workers other than 0 may pass ``dtype`` and ``shape`` instead of ``init``.
        """
        if init is not None:
            arr, code, _ = Group._red(init, writable=False)
            shape_t = tuple(arr.shape)
        else:
            if dtype is None or shape is None:
                raise ValueError("register: pass init, or dtype and shape")
            code, arr = dtype_code(dtype), None
            shape_t = (shape,) if isinstance(shape, int) else tuple(shape)
        count = int(np.prod(shape_t)) if shape_t else 1
        key = super().register(name, code, count, arr)
        self._shapes[key] = (shape_t, code)
        return key

    def _arr(self, key: int, x: Any, what: str, writable: bool = False) -> np.ndarray:
        """x as the tensor's elements: an array of another dtype is refused (its
        bytes would be read or written as the tensor's: garbage values)."""
        arr, code, _ = as_array(x, writable=writable)
        reg = self._shapes.get(key)
        if reg is not None and code != reg[1]:  # None: a dtype the library lacks
            raise TypeError(f"{what}: tensor {key} holds {numpy_dtype(reg[1])}, "
                            f"not {getattr(x, 'dtype', arr.dtype)}")
        return arr

    def _out(self, key: int) -> np.ndarray:
        if key not in self._shapes:
            raise ValueError(f"tensor {key} was not registered on this worker "
                             "(register it, or pass out=)")
        shape, code = self._shapes[key]
        return np.empty(shape, dtype=numpy_dtype(code))

    def push(self, key: int, grad: Any, *, async_op: bool = False) -> Any:
        """Send this step's gradient (or update, with the "sum" optimizer).

        ``async_op=True``: returns a ``Work`` at once (``grad`` must not change
        until it completes); its ``wait()`` returns None.  Ctrl-C in a
        blocking call (main thread) raises KeyboardInterrupt within about
        0.1 s and leaves the operation running, its buffers in use (push,
        pull and pushpull alike; docs/PYTHON.md).
        """
        g = self._arr(key, grad, "push")
        if async_op:
            return Work(super().push(key, g, True), None)
        super().push(key, g)
        return None

    def pull(self, key: int, out: Any = None, *, async_op: bool = False) -> Any:
        """Parameters as of this worker's step, into ``out`` or a new numpy array.

        ``async_op=True``: returns a ``Work`` whose ``wait()`` returns ``out``.
        """
        if out is None:
            out = self._out(key)
        o = self._arr(key, out, "pull", writable=True)
        if async_op:
            return Work(super().pull(key, o, True), out)
        super().pull(key, o)
        return out

    def pushpull(self, key: int, grad: Any, out: Any = None, *, async_op: bool = False) -> Any:
        """push(grad), then the parameters once this step has been applied.

        ``async_op=True``: returns a ``Work`` whose ``wait()`` returns ``out``.
        """
        if out is None:
            out = self._out(key)
        g = self._arr(key, grad, "pushpull")
        o = self._arr(key, out, "pushpull", writable=True)
        if async_op:
            return Work(super().pushpull(key, g, o, True), out)
        super().pushpull(key, g, o)
        return out

    def stats(self) -> dict[str, Any]:
        """This handle's view of the job: its latest shard map's version, the
        servers (index, node, state, blocks, bytes, measured ns per byte,
        straggler), tensors and blocks, and its counters (migrations,
        forwarded requests, redirects, rebalances, lost_steps: workers' steps
        a server counted as empty because their push never came)."""
        return super().stats()

    # -- administration, from any member's context (as `rdmactl ps` does)
    @staticmethod
    def shards(context: Context, job: str = "ps", *, timeout: float | None = None) -> dict[str, Any]:
        """The job's latest shard map, as stats() reads it (no scheduler round trip)."""
        return _c.ps_admin(context, "shards", job, 0, _admin_ms(timeout))

    @staticmethod
    def add_server(context: Context, job: str = "ps", server: int | None = None, *,
                   timeout: float | None = None) -> tuple[int, int]:
        """Admit standby ``server`` (None: the one task placement chooses); returns
        (server, map version carrying it)."""
        if server is not None and (isinstance(server, bool) or not isinstance(server, int)
                                   or server < 0):
            raise ValueError(f"server is an index >= 0 or None, not {server!r}")
        return _c.ps_admin(context, "add", job, -1 if server is None else server,
                           _admin_ms(timeout))

    @staticmethod
    def remove_server(context: Context, job: str, server: int, *,
                      timeout: float | None = None) -> int:
        """Drain ``server``'s blocks to the others; returns the map version that does."""
        if isinstance(server, bool) or not isinstance(server, int) or server < 0:
            raise ValueError(f"server is an index >= 0, not {server!r}")
        return _c.ps_admin(context, "remove", job, server, _admin_ms(timeout))[1]

    @staticmethod
    def rebalance(context: Context, job: str = "ps", *, timeout: float | None = None) -> int:
        """Redistribute blocks now from the latest measurements; returns the map version."""
        return _c.ps_admin(context, "rebalance", job, 0, _admin_ms(timeout))[1]

    @staticmethod
    def set_auto(context: Context, job: str, enabled: bool, *,
                 timeout: float | None = None) -> None:
        """Turn automatic load distribution on or off."""
        _c.ps_admin(context, "auto", job, 1 if enabled else 0, _admin_ms(timeout))


#: Deadline of a parameter-server administration request when none is given
#: (as `rdmactl ps --timeout`'s default).
ADMIN_TIMEOUT = 20.0


def _admin_ms(timeout: float | None) -> int:
    ms = _ms(ADMIN_TIMEOUT if timeout is None else timeout)
    assert ms is not None
    return ms
