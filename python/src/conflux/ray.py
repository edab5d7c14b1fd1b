"""Ray integration: a coordinator for the job, collective groups for actors, object transfer.

The driver starts the job's coordinator; actors join it with the job's token
and use an API that mirrors ``ray.util.collective``::

    import numpy as np, ray, conflux.ray as cr
    ray.init()
    job = cr.start()                             # conflux-coord on the driver's node

    @ray.remote
    class Worker:
        def setup(self, job, world, rank):
            cr.init_collective_group(world, rank, group_name="g", job=job)
        def step(self, x):
            x = np.array(x)                          # Ray passes arrays read-only
            return cr.allreduce(x, group_name="g")   # in place, over Conflux

    ws = [Worker.remote() for _ in range(4)]
    ray.get([w.setup.remote(job, 4, r) for r, w in enumerate(ws)])
    # or, from the driver: cr.create_collective_group(ws, 4, [0, 1, 2, 3], "g", job=job)

Tensors are numpy arrays or torch CPU tensors; collectives work in place as
in ray.util.collective.  Large arrays move between actors by id without
passing through Ray's object store: ``ref = cr.put(arr)`` in one actor,
``cr.get(ref)`` in another (the ref is a small picklable handle).

Each actor process has one Conflux Context for the job (made on first use);
``shutdown()`` in the driver stops the coordinator and removes the groups
it declared.
"""
from __future__ import annotations

import math
import os
import socket
import threading
from dataclasses import dataclass
from enum import Enum
from typing import Any, Sequence

import numpy as np

from ._api import Context, Group, ObjectId, _np_dtype
from ._dtypes import as_array
from .launch import Coordinator

__all__ = ["Job", "ObjectRef", "ReduceOp", "start", "shutdown", "context", "runtime_env",
           "init_collective_group", "create_collective_group", "destroy_collective_group",
           "is_group_initialized", "get_rank", "get_collective_group_size", "allreduce",
           "barrier", "reduce", "broadcast", "allgather", "reducescatter", "send", "recv",
           "put", "get", "delete"]


@dataclass(frozen=True)
class Job:
    """Where the job's coordinator listens, and its token: what an actor needs to join."""
    coord: str
    token: str
    timeout: float = 60.0  # default deadline of every call, in seconds

    def env(self) -> dict[str, str]:
        return {"CFX_COORD": self.coord, "CFX_TOKEN": self.token,
                "CFX_TIMEOUT_MS": str(int(self.timeout * 1000))}


class ReduceOp(Enum):
    SUM = "sum"
    PRODUCT = "prod"
    MIN = "min"
    MAX = "max"


_coordinator: Coordinator | None = None
_lock = threading.Lock()
_ctx: Context | None = None
_ctx_job: Job | None = None
_ctx_coord: str | None = None  # the coordinator _ctx joined (from job or CFX_COORD)
_groups: dict[str, Group] = {}
_puts: dict[str, Any] = {}
# group name -> (Ray job id, record): the records (named actors)
# create_collective_group() made in this process, which only this process
# removes (destroy_collective_group(), shutdown())
_declared: dict[str, tuple[str, Any]] = {}


def _node_ip() -> str:
    try:
        import ray
        return ray.util.get_node_ip_address()
    except Exception:  # not in a Ray process: the loopback is the job
        return socket.gethostbyname("localhost")


def start(bind: str | None = None, timeout: float = 60.0) -> Job:
    """Driver: start the job's coordinator (once) on this node; returns the Job handle."""
    global _coordinator
    with _lock:
        if _coordinator is None:
            _coordinator = Coordinator(bind=bind or _node_ip(), timeout=timeout)
        return Job(_coordinator.address, _coordinator.token, timeout)


def shutdown() -> None:
    """Driver: stop the coordinator (actors should have left their groups).

    This process leaves the job first: its groups and its Context close, its
    puts are withdrawn and the records of the groups it declared are removed,
    so that a later start() begins a new job that this process can join (the
    old Context would point at the stopped coordinator) and that may declare
    those groups again.
    """
    global _coordinator, _ctx, _ctx_job, _ctx_coord
    with _lock:
        for g in _groups.values():
            g.close()
        _groups.clear()
        _puts.clear()
        for name in list(_declared):
            _remove_record(name)
        if _ctx is not None:
            _ctx.close()
            _ctx, _ctx_job, _ctx_coord = None, None, None
        if _coordinator is not None:
            _coordinator.stop()
            _coordinator = None


def runtime_env(job: Job) -> dict[str, Any]:
    """A runtime_env for actors that join with CFX_COORD / CFX_TOKEN from the environment."""
    return {"env_vars": job.env()}


def context(job: Job | None = None) -> Context:
    """This process's Context for the job (made on first use; from CFX_* when job is None)."""
    global _ctx, _ctx_job, _ctx_coord
    with _lock:
        # joined from the environment (runtime_env(job)), then named by its
        # Job (a declared group, job=): the same job, at the same coordinator
        if _ctx is not None and (job is None or job == _ctx_job or
                                 (_ctx_job is None and job.coord == _ctx_coord)):
            return _ctx
        if _ctx is not None:
            raise RuntimeError("this process already joined another Conflux job")
        if job is None:
            if "CFX_COORD" not in os.environ:
                raise RuntimeError("no Conflux job: pass job= (from conflux.ray.start()) "
                                   "or set CFX_COORD and CFX_TOKEN")
            coord = os.environ["CFX_COORD"]
            _ctx = Context()
        else:
            coord = job.coord
            _ctx = Context(coord=job.coord, token=job.token, timeout=job.timeout)
        _ctx_job, _ctx_coord = job, coord
        return _ctx


# -- collective groups --------------------------------------------------------------

def init_collective_group(world_size: int, rank: int, backend: str = "conflux",
                          group_name: str = "default", job: Job | None = None,
                          timeout: float | None = None) -> None:
    """Actor: join collective group ``group_name`` as ``rank`` of ``world_size`` (waits for all)."""
    if backend not in ("conflux", "cfx"):
        raise ValueError(f"backend {backend!r}: conflux.ray provides the 'conflux' backend")
    if group_name in _groups:
        raise RuntimeError(f"group {group_name!r} is already initialized in this process")
    ctx = context(job)
    _groups[group_name] = Group(ctx, group_name, rank=rank, size=world_size, timeout=timeout)


def _info_name(group_name: str) -> str:
    return f"conflux_group_info:{group_name}"


def create_collective_group(actors: Sequence[Any], world_size: int, ranks: Sequence[int],
                            group_name: str = "default", job: Job | None = None,
                            backend: str = "conflux") -> None:
    """Driver: declare a group of actors; each joins on its first collective call.

    As in ray.util.collective, the declaration lives in a named actor that
    the members read, so the actors need no setup method of their own.  It
    belongs to this process: destroy_collective_group() or shutdown() here
    removes it, and it ends with this process's Ray job.  A group name
    declared and not yet removed is a RuntimeError.
    """
    import ray
    if len(actors) != len(ranks) or sorted(ranks) != list(range(world_size)):
        raise ValueError("ranks must be a permutation of range(world_size), one per actor")
    job = job or start()
    ids = [a._actor_id.hex() for a in actors]

    @ray.remote(num_cpus=0)
    class _Info:
        def __init__(self, ids: list[str], ranks: list[int], world: int, job: Job):
            self.v = (dict(zip(ids, ranks)), world, job)

        def get(self):
            return self.v

    # Not detached: the record is this process's (its handle is kept in
    # _declared), so it goes when this job ends, whatever the way, and never
    # outlives it for a later job to find.
    try:
        info = _Info.options(name=_info_name(group_name)).remote(
            ids, list(ranks), world_size, job)
    except ValueError as e:  # Ray's ActorAlreadyExistsError
        if "already" not in str(e):
            raise
        raise RuntimeError(f"collective group {group_name!r} is already declared in this Ray "
                           "job (destroy_collective_group() in the process that declared "
                           "it removes it)") from None
    _declared[group_name] = (ray.get_runtime_context().get_job_id(), info)


def _remove_record(group_name: str) -> None:
    """Remove the record this process declared for ``group_name`` and wait until it is gone."""
    declared = _declared.pop(group_name, None)
    if declared is None:
        return
    import ray
    job_id, info = declared
    if not ray.is_initialized() or ray.get_runtime_context().get_job_id() != job_id:
        return  # the Ray job that declared it ended (ray.shutdown()), and the record with it
    # Ray's own graceful end (as ray.util.queue's): ready once the record has
    # exited, which frees its name for a later declaration
    done, _ = ray.wait([info.__ray_terminate__.remote()], timeout=30)
    if not done:
        ray.kill(info)


def _group(group_name: str) -> Group:
    g = _groups.get(group_name)
    if g is not None:
        return g
    import ray  # a declared group: join it now
    try:
        info = ray.get_actor(_info_name(group_name))
    except ValueError:
        raise RuntimeError(f"collective group {group_name!r} is not initialized here") from None
    try:
        ids, world, job = ray.get(info.get.remote())
    except ray.exceptions.RayActorError:  # removed while we asked
        raise RuntimeError(f"collective group {group_name!r} is not initialized here") from None
    me = ray.get_runtime_context().get_actor_id()
    if me not in ids:
        raise RuntimeError(f"this actor is not a member of group {group_name!r}")
    init_collective_group(world, ids[me], group_name=group_name, job=job)
    return _groups[group_name]


def destroy_collective_group(group_name: str = "default") -> None:
    """Leave the group in this process; in the process that declared it
    (create_collective_group), also remove its record.

    Elsewhere the record stays for the other members: a process that is not
    in the group, that left it already or that never made a call in it has
    nothing to leave, and this does nothing there.
    """
    g = _groups.pop(group_name, None)
    if g is not None:
        g.close()
    _remove_record(group_name)


def is_group_initialized(group_name: str = "default") -> bool:
    return group_name in _groups


def get_rank(group_name: str = "default") -> int:
    return _group(group_name).rank


def get_collective_group_size(group_name: str = "default") -> int:
    return _group(group_name).size


def _op(op: ReduceOp | str) -> str:
    return op.value if isinstance(op, ReduceOp) else op


def allreduce(tensor: Any, group_name: str = "default", op: ReduceOp | str = ReduceOp.SUM) -> Any:
    """In place: ``op`` over the group's ranks.  Returns ``tensor``."""
    return _group(group_name).allreduce(tensor, _op(op))


def barrier(group_name: str = "default") -> None:
    _group(group_name).barrier()


def reduce(tensor: Any, dst_rank: int = 0, group_name: str = "default",
           op: ReduceOp | str = ReduceOp.SUM) -> Any:
    """In place at ``dst_rank``; the others' tensors are unchanged."""
    _group(group_name).reduce(tensor, root=dst_rank, op=_op(op))
    return tensor


def broadcast(tensor: Any, src_rank: int = 0, group_name: str = "default") -> Any:
    return _group(group_name).broadcast(tensor, root=src_rank)


def allgather(tensor_list: list, tensor: Any, group_name: str = "default") -> list:
    """Fill ``tensor_list`` (world_size tensors like ``tensor``) with every rank's tensor."""
    g = _group(group_name)
    if len(tensor_list) != g.size:
        raise ValueError(f"tensor_list needs {g.size} tensors")
    stacked = g.allgather(tensor)
    for i, (dst, src) in enumerate(zip(tensor_list, stacked)):
        # assigned as they are: a cast or a broadcast would hide a mistake
        if tuple(dst.shape) != tuple(src.shape) or dst.dtype != src.dtype:
            raise ValueError(f"allgather: tensor_list[{i}] is {tuple(dst.shape)} {dst.dtype}, "
                             f"not {tuple(src.shape)} {src.dtype} like tensor")
        dst[...] = src
    return tensor_list


def reducescatter(tensor: Any, tensor_list: list, group_name: str = "default",
                  op: ReduceOp | str = ReduceOp.SUM) -> Any:
    """``tensor`` = ``op`` over ranks of their ``tensor_list[rank]``."""
    g = _group(group_name)
    if len(tensor_list) != g.size:
        raise ValueError(f"tensor_list needs {g.size} tensors")
    if _is_torch(tensor):
        import torch
        src = torch.stack(list(tensor_list))
    else:
        src = np.stack(tensor_list)
    g.reduce_scatter(src, _op(op), out=tensor)
    return tensor


def send(tensor: Any, dst_rank: int, group_name: str = "default", tag: int = 0) -> None:
    _group(group_name).send(tensor, dst_rank, tag)


def recv(tensor: Any, src_rank: int, group_name: str = "default", tag: int = 0) -> Any:
    return _group(group_name).recv(tensor, src_rank, tag)


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


# -- objects ------------------------------------------------------------------------

@dataclass(frozen=True)
class ObjectRef:
    """A handle to an array held by Conflux: its id, dtype and shape (small, picklable)."""
    id_hex: str
    dtype: str
    shape: tuple[int, ...]

    @property
    def id(self) -> ObjectId:
        return ObjectId.from_hex(self.id_hex)


def put(array: Any, name: str | None = None, job: Job | None = None) -> ObjectRef:
    """Publish ``array`` from this process (zero-copy: keep it unchanged until delete()).

    ``array`` is a numpy array or a torch CPU tensor (bfloat16 included; a
    getter without ``out`` receives it as numpy: ml_dtypes' bfloat16 when
    installed, else its uint16 bits).  A non-contiguous one is copied first.
    """
    ctx = context(job)
    if _is_torch(array):
        # as the collectives take tensors: a contiguous copy when it is not
        # (as for numpy below), bfloat16 as its int16 bits (numpy has no
        # bfloat16, so Tensor.numpy() refuses it), other types numpy knows as
        # themselves (complex, uint16 ..) and the rest (float8 kinds) as an
        # integer of their size: the shape is the tensor's either way
        a, _, _ = as_array(array.detach().contiguous())
    else:
        a = np.require(array, requirements="C")  # a 0-d array stays 0-d
    dtype = _dtype_str(array, a)
    oid = ObjectId.from_name(name) if name else ctx.new_id()
    ctx.put(oid, a)
    _puts[oid.hex] = a  # the library serves this memory until delete()
    return ObjectRef(oid.hex, dtype, tuple(a.shape))


def _dtype_str(x: Any, a: np.ndarray | None = None) -> str:
    """The dtype an ObjectRef records for ``x`` (``a``: x as numpy, when at hand)."""
    if _is_torch(x):
        if str(x.dtype) == "torch.bfloat16":
            return "bfloat16"
        import torch
        return as_array(torch.empty(0, dtype=x.dtype))[0].dtype.str
    a = np.asarray(x) if a is None else a
    return "bfloat16" if a.dtype.name == "bfloat16" else a.dtype.str


def get(ref: ObjectRef, out: Any = None, timeout: float | None = None,
        job: Job | None = None) -> Any:
    """Fetch ``ref`` into ``out`` or a new numpy array of its dtype and shape.

    ``out`` (an array or tensor of the put's dtype and shape, or a writable
    buffer of its size in bytes) is filled and returned; another dtype is a
    TypeError, another shape or size a ValueError.
    """
    ctx = context(job)
    if out is not None:
        # its bytes are taken as out's elements: an array or tensor of
        # another type gets garbage (a bytearray or memoryview takes bytes)
        if hasattr(out, "dtype"):
            if _dtype_str(out) != ref.dtype:
                raise TypeError(f"get: the object holds {ref.dtype}, out is {out.dtype}")
            if tuple(out.shape) != ref.shape:
                # a larger out got the bytes at its start and a uint8 view of
                # them back, not out
                raise ValueError(f"get: the object has shape {ref.shape}, out has shape "
                                 f"{tuple(out.shape)}")
        else:
            size = math.prod(ref.shape) * _np_dtype(ref.dtype).itemsize
            if memoryview(out).nbytes != size:
                raise ValueError(f"get: the object has {size} bytes, out has "
                                 f"{memoryview(out).nbytes}")
        return ctx.get(ref.id, out=out, timeout=timeout)
    return ctx.get(ref.id, timeout=timeout, dtype=_np_dtype(ref.dtype), shape=ref.shape)


def delete(ref: ObjectRef, job: Job | None = None) -> None:
    """Withdraw ``ref`` (from the process that put it: everywhere)."""
    context(job).delete(ref.id)
    _puts.pop(ref.id_hex, None)
