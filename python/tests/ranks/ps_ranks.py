"""Parameter server from Python: rank 0 serves, the others are workers.

Job "py-sum": the servers sum pushes (BSP); every pull must equal the
initial values plus every worker's gradients of the steps so far.
Job "py-sgd": the server applies SGD (p -= lr * sum of pushes) itself.
Values are small integers and lr a power of two, so results are exact.
"""
import os
import sys

import numpy as np

import conflux

rank = int(os.environ["CFX_RANK"])
size = int(os.environ["CFX_WORLD_SIZE"])
W = size - 1
role = "server" if rank == 0 else "worker"
index = 0 if rank == 0 else rank - 1
shape = (300, 700)  # 840 KB of float32: several blocks at block_size 64 KiB
init = (np.arange(np.prod(shape)) % 13).astype(np.float32).reshape(shape)


def grad(w, step):
    return ((np.arange(np.prod(shape)) + w * 5 + step) % 7).astype(np.float32).reshape(shape)


def fail(msg):
    print(f"rank {rank}: {msg}", file=sys.stderr)
    sys.exit(1)


for job, opt in [("py-sum", "sum"), ("py-sgd", "sgd")]:
    with conflux.Context(timeout=60) as ctx:
        ps = conflux.ParameterServer(ctx, job, role=role, index=index, num_workers=W,
                                     num_servers=1, optimizer=opt, lr=0.5,
                                     block_size=64 << 10, timeout=60)
        if role == "server":
            ps.serve(timeout=120)
        else:
            key = ps.register("w", init if index == 0 else None, dtype=np.float32, shape=shape)
            want = init.copy()
            for step in range(3):
                g = grad(index, step)
                got = ps.pushpull(key, g)
                total = sum(grad(w, step) for w in range(W))
                want = want + total if opt == "sum" else want - 0.5 * total
                if not np.array_equal(got, want):
                    fail(f"{job} step {step}: pushpull differs from the reference")
            # two more steps through the non-blocking forms: a push then a pull
            # of its step, and a pushpull (Work.wait returns the output)
            for step in (3, 4):
                total = sum(grad(w, step) for w in range(W))
                want = want + total if opt == "sum" else want - 0.5 * total
                if step == 3:
                    ps.push(key, grad(index, step), async_op=True).wait(timeout=60)
                    w = ps.pull(key, async_op=True)
                else:
                    w = ps.pushpull(key, grad(index, step), async_op=True)
                got = w.wait(timeout=60)
                if not w.is_completed() or not np.array_equal(got, want):
                    fail(f"{job} step {step}: the non-blocking form differs from the reference")
            out = np.empty(shape, np.float32)
            ps.pull(key, out)
            if not np.array_equal(out, want):
                fail(f"{job}: final pull differs from the reference")
            try:
                ps.push(key, np.zeros(5, np.float32))
            except ValueError:
                pass
            else:
                fail("a push of the wrong size was not refused")
            try:  # the tensor's size in bytes, but int32: its bits would be read as floats
                ps.push(key, np.zeros(shape, np.int32))
            except TypeError as e:
                if "float32" not in str(e) or "int32" not in str(e):
                    fail(f"the dtype error does not name both dtypes: {e}")
            else:
                fail("a push of another dtype of the same size was not refused")
            try:  # a dtype the library has no code for (it was let through)
                ps.push(key, np.zeros(2 * int(np.prod(shape)), np.uint16))
            except TypeError as e:
                if "float32" not in str(e) or "uint16" not in str(e):
                    fail(f"the dtype error does not name both dtypes: {e}")
            else:
                fail("a push of uint16 (no code of the library's) was not refused")
            # the handle's view and the job's shard map, from the C library's
            # cfx_ps_stats / cfx_ps_shards
            st = ps.stats()
            if (st["tensors"] != 1 or st["blocks"] < 2 or len(st["servers"]) != 1
                    or st["servers"][0]["state"] != "active"
                    or st["servers"][0]["blocks"] != st["blocks"]):
                fail(f"{job}: stats() {st}")
            sh = conflux.ParameterServer.shards(ctx, job, timeout=10)
            if sh["map_version"] < 1 or sh["blocks"] != st["blocks"]:
                fail(f"{job}: shards() {sh} against stats() {st}")
            # both workers ask at once: two administrators racing for the
            # request numbers are served in turn, each its own answer
            try:
                conflux.ParameterServer.remove_server(ctx, job, 0, timeout=10)
            except conflux.Error as e:  # the scheduler's answer
                if e.name != "CFX_ERR_BUSY" or "cannot be removed" not in str(e):
                    fail(f"{job}: removing server 0: {e.name}: {e}")
            else:
                fail(f"{job}: server 0 (the scheduler) was removed")
        ps.close()
print(f"rank {rank}: ok")
