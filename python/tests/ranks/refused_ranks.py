"""A collective that rank 0 refuses in Python still takes its turn, and rank 1 is told.

Rank 0 calls each collective with an argument this package turns down before
the call reaches the library (a read-only output, a wrong-size output, a
negative timeout, an unknown op); rank 1 calls it as it should.  Rank 0 gets
its Python error; rank 1's call fails with PeerFailedError saying that rank 0
refused its arguments (as for a call the library refuses), or, where rank 1 only sends (a reduce's leaf), may
succeed; and the next call of both pairs with the other's next call, every
byte right.  Before, the refused call took no turn: rank 0's next allreduce
was summed with rank 1's refused one and both returned wrong data without an
error, or the next barrier failed on a malformed header.
"""
import sys

import numpy as np

import conflux

ctx = conflux.Context(timeout=30)
g = conflux.Group(ctx, "refused", timeout=30)
rank = g.rank
assert g.size == 2, g.size
ro = np.ones(4, np.float32)
ro.flags.writeable = False


def sum_right(tag):
    """Both ranks' next allreduce pairs with the other's: 10 + 100 on each."""
    y = np.full(4, 10 if rank == 0 else 100, np.float32)
    g.allreduce(y, timeout=20)
    if not (y == 110).all():
        sys.exit(f"rank {rank}: after the refused {tag}, allreduce gave {y}, not 110")


def refused_by_rank0(tag, call, may_pass=False):
    """Rank 1's side of a call rank 0 refused: PeerFailedError naming the refusal."""
    try:
        call()
    except conflux.PeerFailedError as e:
        assert "rank 0" in e.detail and "refused the arguments" in e.detail, e.detail
    else:
        if not may_pass:
            sys.exit(f"rank 1: {tag}: rank 0 refused its call, and rank 1's succeeded")


x = np.ones(4, np.float32)
cases = [
    ("allreduce", lambda: g.allreduce(ro), lambda: g.allreduce(x, timeout=20), False),
    ("async allreduce", lambda: g.allreduce(ro, async_op=True),
     lambda: g.allreduce(x, timeout=20, async_op=True).wait(), False),
    ("reduce", lambda: g.reduce(x, root=0, out=np.zeros(3, np.float32)),
     lambda: g.reduce(x, root=0, timeout=20), True),
    ("broadcast", lambda: g.broadcast(x, timeout=-1), lambda: g.broadcast(x, timeout=20),
     False),
    ("allgather", lambda: g.allgather(x, out=np.zeros(2, np.float32)),
     lambda: g.allgather(x, timeout=20), False),
    ("barrier", lambda: g.barrier(timeout=-1), lambda: g.barrier(timeout=20), False),
    ("allreduce op", lambda: g.allreduce(x, op="avg"), lambda: g.allreduce(x, timeout=20),
     False),
]
for tag, bad, good, leaf in cases:
    if rank == 0:
        try:
            bad()
        except (ValueError, TypeError):
            pass
        else:
            sys.exit(f"rank 0: {tag}: the bad call was not refused")
    else:
        refused_by_rank0(tag, good, may_pass=leaf)
    sum_right(tag)
g.close()
ctx.close()
print(f"rank {rank}: ok", flush=True)
