"""Ranks forcing different algorithms fail the call with InvalidError on every rank.

Rank 0 runs a ring allreduce, rank 1 a tree: between shm ranks the tree's
messages go as eager pieces that fill rank 0's unexpected queue, and rank
0's first receive fails on the message sizes while it waits on its send,
which rank 1 never asks for.  Rank 0 used to wait out the deadline and
raise TimeoutError.
"""
import sys

import numpy as np

import conflux

ctx = conflux.Context(timeout=30)
g = conflux.Group(ctx, "algos", timeout=30)
rank = g.rank
x = np.ones(1 << 16, np.float32)  # 256 KiB: 128 KiB ring blocks, 64 KiB tree pieces
try:
    g.allreduce(x, algo="ring" if rank == 0 else "tree", timeout=20)
except conflux.InvalidError as e:
    assert e.status == -1 and e.name == "CFX_ERR_INVALID", e
except conflux.Error as e:
    sys.exit(f"rank {rank}: {e.name} ({e.detail}), not CFX_ERR_INVALID")
else:
    sys.exit(f"rank {rank}: an allreduce whose ranks forced different algorithms succeeded")
# the group still works once both agree again
y = np.full(4, rank + 1, np.float32)
g.allreduce(y, timeout=20)
assert (y == 3).all(), y
g.close()
ctx.close()
print(f"rank {rank}: ok", flush=True)
