"""PyTorch integration: a DDP communication hook and a parameter-server optimizer.

DDP with gradients allreduced through a Conflux group::

    import torch.distributed as dist, conflux, conflux.torch as cft
    dist.init_process_group("gloo", ...)        # DDP still needs one for its setup
    ctx = conflux.Context(); group = conflux.Group(ctx, "ddp")
    model = torch.nn.parallel.DistributedDataParallel(net)
    model.register_comm_hook(cft.AllreduceHookState(group), cft.allreduce_hook)

Each gradient bucket is divided by the world size and summed over the group,
as DDP's own allreduce does, in a thread of its own (the GIL is released
while Conflux works) so communication overlaps the rest of the backward pass.
"""
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Iterable

import torch
import torch.distributed as dist

from ._api import Group, ParameterServer, _ms

__all__ = ["AllreduceHookState", "allreduce_hook", "ParameterServerOptimizer"]


class AllreduceHookState:
    """State of allreduce_hook: the group, and how buckets travel.

    Args:
        group: the conflux.Group of the DDP ranks (same size and rank order).
        timeout: deadline of each bucket's allreduce, in seconds (None: the group's).
        compress: None, torch.float16 or torch.bfloat16: buckets travel in that
            dtype and are cast back (as DDP's fp16/bf16 compression hooks do).
        overlap: run allreduces on a background thread (default); False runs
            each inside the hook.  On the background thread Ctrl-C waits for
            them (their deadline, when a peer hangs); inside the hook, on the
            main thread, it cancels the bucket's allreduce and backward()
            raises RuntimeError naming KeyboardInterrupt.

    A group that is not a conflux.Group is a TypeError, a timeout that is not
    a number of seconds >= 0 a TypeError or ValueError (here, not in backward()).
    """

    def __init__(self, group: Group, *, timeout: float | None = None,
                 compress: torch.dtype | None = None, overlap: bool = True):
        # checked here, not first in backward(), where a failed bucket's
        # error reaches the caller as a RuntimeError naming it
        if not isinstance(group, Group):
            raise TypeError(f"AllreduceHookState: group must be a conflux.Group, not "
                            f"{type(group).__name__} {group!r}")
        _ms(timeout)  # a number of seconds, finite and >= 0, or None (TypeError / ValueError)
        if compress not in (None, torch.float16, torch.bfloat16):
            raise ValueError("compress must be None, torch.float16 or torch.bfloat16")
        self.group = group
        self.timeout = timeout
        self.compress = compress
        # One thread: buckets are allreduced in the order DDP hands them over,
        # the same on every rank, and a group is used by one thread at a time.
        self.pool = ThreadPoolExecutor(1, thread_name_prefix="conflux-ddp") if overlap else None
        self.buckets = 0  # buckets allreduced so far

    def close(self) -> None:
        if self.pool:
            self.pool.shutdown(wait=True)
            self.pool = None

    def __getstate__(self) -> dict:  # DDP may pickle hook state; a group does not travel
        raise TypeError("AllreduceHookState cannot be pickled")


def _allreduce_bucket(state: AllreduceHookState, buf: torch.Tensor) -> torch.Tensor:
    world = state.group.size
    if state.compress is not None:
        wire = buf.to(state.compress).div_(world)
        state.group.allreduce(wire, "sum", timeout=state.timeout)
        buf.copy_(wire)
    else:
        buf.div_(world)
        state.group.allreduce(buf, "sum", timeout=state.timeout)
    state.buckets += 1
    return buf


# The annotations are real objects, not strings: DDP checks them.
def allreduce_hook(state: AllreduceHookState,
                   bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: the bucket's gradients averaged over the Conflux group."""
    buf = bucket.buffer()
    fut: torch.futures.Future[Any] = torch.futures.Future()

    def run() -> None:
        try:
            fut.set_result(_allreduce_bucket(state, buf))
        except BaseException as e:  # raised by _raise_error, below
            fut.set_result(e)

    # DDP's reducer reads the future's value in C++ as a tensor: an error set
    # with Future.set_exception() (a Python-side unwrap) reached backward()
    # as "Unable to cast CFX_ERR_... to Tensor".  Raised in a then() callback
    # it marks the returned future failed in C++, and backward() raises
    # RuntimeError naming the conflux error's class and detail.
    out = fut.then(_raise_error)
    if state.pool is not None:
        state.pool.submit(run)
    else:
        run()
    return out


def _raise_error(fut: torch.futures.Future) -> torch.Tensor:
    v = fut.value()
    if isinstance(v, BaseException):
        raise v
    return v


class ParameterServerOptimizer:
    """Train through Conflux's parameter server: the servers hold the parameters.

    Each parameter is registered with ``ps`` (a worker ParameterServer; the
    job's server 0 chose the optimizer, e.g. optimizer="sgd", lr=...,
    grad_scale=1/num_workers for the mean gradient).  Worker 0's values
    initialise the servers; every worker starts from them.  step() pushes
    each gradient and pulls the updated parameter in place (BSP: once every
    worker pushed).
    """

    def __init__(self, params: Iterable[torch.nn.Parameter], ps: ParameterServer, *,
                 prefix: str = "param"):
        self.ps = ps
        self.params = [p for p in params]
        for p in self.params:
            if p.device.type != "cpu" or not p.data.is_contiguous():
                raise ValueError("ParameterServerOptimizer takes contiguous CPU parameters")
        self.keys: list[int] = []
        for i, p in enumerate(self.params):
            # every worker offers its values; the servers keep worker 0's
            key = ps.register(f"{prefix}.{i}", p.data)
            ps.pull(key, p.data)
            self.keys.append(key)

    def zero_grad(self, set_to_none: bool = True) -> None:
        for p in self.params:
            if set_to_none:
                p.grad = None
            elif p.grad is not None:
                p.grad.zero_()

    @torch.no_grad()
    def step(self) -> None:
        for p, key in zip(self.params, self.keys):
            g = p.grad if p.grad is not None else torch.zeros_like(p.data)
            self.ps.pushpull(key, g.contiguous(), p.data)
