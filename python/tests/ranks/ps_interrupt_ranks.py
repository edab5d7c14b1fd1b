"""Ctrl-C (KeyboardInterrupt) ends a blocking pushpull held up by the other
worker (BSP) long before its 60 s deadline; the op is canceled (the push it
made, held by the server, is applied in its round), and the job
goes on with the next step.

Rank 0 serves; ranks 1 and 2 are workers 0 and 1.  Worker 0 is
interrupted in step 0; worker 1 pushes its step 0 only once told so
(an object worker 0 puts).  The deadlines are 60 s and the test's harness
gives up sooner: a call that ignored Ctrl-C fails the test by timing out.
"""
import os
import sys

import numpy as np

import conflux
from sigint import interrupted

rank = int(os.environ["CFX_RANK"])
shape = (1000,)
init = (np.arange(shape[0]) % 13).astype(np.float32)


def grad(w, step):
    return ((np.arange(shape[0]) + 5 * w + step) % 7).astype(np.float32)


def fail(msg):
    sys.exit(f"rank {rank}: {msg}")


with conflux.Context(timeout=60) as ctx:
    role, index = ("server", 0) if rank == 0 else ("worker", rank - 1)
    with conflux.ParameterServer(ctx, "sigint-ps", role=role, index=index, num_workers=2,
                                 num_servers=1, optimizer="sum", timeout=60) as ps:
        if role == "server":
            ps.serve(timeout=120)
        else:
            key = ps.register("w", init if index == 0 else None, dtype=np.float32,
                              shape=shape)
            if index == 0:
                out = np.zeros(shape, np.float32)
                interrupted("ParameterServer.pushpull", ps.pushpull, key, grad(0, 0), out)
                ctx.put("ps-interrupted", b"1")
            else:
                ctx.get("ps-interrupted", timeout=60)
                got = ps.pushpull(key, grad(1, 0))
                if not np.array_equal(got, init + grad(0, 0) + grad(1, 0)):
                    fail("step 0 lost the interrupted worker's push")
            # the interrupted push counts as made: step 1 follows it on both workers
            got = ps.pushpull(key, grad(index, 1))
            want = init + sum(grad(w, s) for w in (0, 1) for s in (0, 1))
            if not np.array_equal(got, want):
                fail("step 1 differs from the reference")
print(f"rank {rank}: ok", flush=True)
