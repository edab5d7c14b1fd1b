"""Group errors by code: a receive nobody answers times out; a dead peer fails the wait."""
import os
import sys

import numpy as np

import conflux

ctx = conflux.Context(timeout=30)
g = conflux.Group(ctx, "errs", timeout=30)
rank = g.rank
buf = np.zeros(1000, np.float32)
if rank == 0:
    try:
        g.recv(buf, 1, tag=9, timeout=0.3)
    except conflux.TimeoutError as e:
        assert e.status == -3 and e.name == "CFX_ERR_TIMEOUT" and e.detail, e
    else:
        sys.exit("a receive with no sender did not time out")
g.barrier()
if rank == 1:
    print("rank 1: ok", flush=True)
    os._exit(0)  # dies without leaving the group
try:
    g.recv(buf, 1, tag=10, timeout=20)
except conflux.PeerFailedError as e:
    assert e.status == -4 and "rank 1" in e.detail, e.detail
else:
    sys.exit("a receive from a dead peer succeeded")
g.close()  # leaving a group with a dead member is bounded too
ctx.close()
print("rank 0: ok", flush=True)
