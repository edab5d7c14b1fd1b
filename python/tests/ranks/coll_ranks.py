"""Every group collective on every dtype, checked byte for byte against numpy.

Run as ranks of cfx_run:  cfx_run -n N python coll_ranks.py [--torch]
Each rank exits non-zero (with the failing case on stderr) on the first mismatch.
"""
import sys
import threading
import time

import numpy as np

import conflux

use_torch = "--torch" in sys.argv
if use_torch:
    import torch

ctx = conflux.Context(timeout=60)
g = conflux.Group(ctx, "coll", timeout=60)
rank, size = g.rank, g.size

# Values are small integers, so every sum, product, min and max is exact in
# every dtype (float16 and bfloat16 included) whatever the reduction order.
DTYPES = ["float32", "float64", "float16", "int32", "int64", "uint8"]
try:
    import ml_dtypes  # noqa: F401
    DTYPES.append("bfloat16")
except ImportError:
    pass


def np_dt(name):
    if name == "bfloat16":
        import ml_dtypes
        return np.dtype(ml_dtypes.bfloat16)
    return np.dtype(name)


def data(r, n, name, salt=0):
    """Rank r's input: small integers, the same formula on every rank."""
    v = (np.arange(n, dtype=np.int64) * 7 + r * 3 + salt) % 5 + 1
    return v.astype(np.float64).astype(np_dt(name))


def ref_reduce(arrs, op):
    acc = arrs[0].astype(np.float64)
    for a in arrs[1:]:
        b = a.astype(np.float64)
        acc = {"sum": acc + b, "prod": acc * b, "min": np.minimum(acc, b),
               "max": np.maximum(acc, b)}[op]
    if arrs[0].dtype == np.uint8:
        return (acc.astype(np.int64) % 256).astype(np.uint8)
    return acc.astype(arrs[0].dtype)


def same(a, b, what):
    a = np.asarray(a)
    b = np.asarray(b)
    if a.shape != b.shape or a.dtype != b.dtype or a.tobytes() != b.tobytes():
        print(f"rank {rank}: MISMATCH {what}: got {a!r} want {b!r}", file=sys.stderr)
        sys.exit(1)


def wrap(a):
    """numpy -> torch when testing tensors (bfloat16 through torch's own dtype)."""
    if not use_torch:
        return a
    if a.dtype.name == "bfloat16":
        return torch.from_numpy(a.view(np.int16).copy()).view(torch.bfloat16)
    return torch.from_numpy(a.copy())


def unwrap(t):
    if not use_torch:
        return t
    if t.dtype == torch.bfloat16:
        import ml_dtypes
        return t.view(torch.int16).numpy().view(ml_dtypes.bfloat16)
    return t.numpy()


n = 1000 + 3  # not a multiple of anything
for name in DTYPES:
    ins = [data(r, n, name) for r in range(size)]
    for op in ["sum", "prod", "min", "max"]:
        ops_in = [data(r, n, name) % 2 + 1 if op == "prod" else ins[r] for r in range(size)]
        ops_in = [a.astype(np_dt(name)) for a in ops_in]
        want = ref_reduce(ops_in, op)
        x = wrap(ops_in[rank].copy())
        g.allreduce(x, op)  # in place
        same(unwrap(x), want, f"allreduce {name} {op}")
        out = wrap(np.zeros(n, np_dt(name)))
        g.allreduce(wrap(ops_in[rank]), op, out=out)
        same(unwrap(out), want, f"allreduce out= {name} {op}")
        root = size - 1
        r = g.reduce(wrap(ops_in[rank]), root=root, op=op, out=wrap(np.zeros(n, np_dt(name))))
        if rank == root:
            same(unwrap(r), want, f"reduce {name} {op}")
        else:
            assert r is None
    # broadcast from each root
    for root in range(size):
        b = wrap(ins[rank].copy() if rank == root else np.zeros(n, np_dt(name)))
        g.broadcast(b, root=root)
        same(unwrap(b), ins[root], f"broadcast {name} root {root}")
    # allgather: result (size, n)
    ag = g.allgather(wrap(ins[rank]))
    same(unwrap(ag), np.stack(ins), f"allgather {name}")
    # reduce_scatter: each rank gives (size, m); block `rank` of the sum
    m = 37
    rs_in = [data(r, size * m, name, salt=1).reshape(size, m) for r in range(size)]
    rs = g.reduce_scatter(wrap(rs_in[rank]))
    same(unwrap(rs), ref_reduce([a[rank] for a in rs_in], "sum"), f"reduce_scatter {name}")
    # alltoall: block q of rank r's result is block r of rank q's input
    a2a_in = [data(r, size * m, name, salt=2).reshape(size, m) for r in range(size)]
    a2a = g.alltoall(wrap(a2a_in[rank]))
    same(unwrap(a2a), np.stack([a2a_in[q][rank] for q in range(size)]), f"alltoall {name}")
    # gather at root 0, scatter from root 1 % size
    ga = g.gather(wrap(ins[rank]), root=0)
    if rank == 0:
        same(unwrap(ga), np.stack(ins), f"gather {name}")
    else:
        assert ga is None
    sroot = 1 % size
    sc_src = data(sroot, size * m, name, salt=3).reshape(size, m)
    sc = g.scatter(wrap(np.zeros(m, np_dt(name))), wrap(sc_src) if rank == sroot else None,
                   root=sroot)
    same(unwrap(sc), sc_src[rank], f"scatter {name}")

# send/recv around the ring, two tags, matched per tag in posting order
nxt, prv = (rank + 1) % size, (rank - 1) % size
if size > 1:
    msgs = {t: data(rank, 4096 + t, "float32", salt=t) for t in (0, 5)}
    if rank % 2 == 0:
        for t in (0, 5):
            g.send(wrap(msgs[t]), nxt, tag=t)
        got = {t: g.recv(wrap(np.zeros(4096 + t, np.float32)), prv, tag=t) for t in (0, 5)}
    else:
        got = {t: g.recv(wrap(np.zeros(4096 + t, np.float32)), prv, tag=t) for t in (0, 5)}
        for t in (0, 5):
            g.send(wrap(msgs[t]), nxt, tag=t)
    for t in (0, 5):
        same(unwrap(got[t]), data(prv, 4096 + t, "float32", salt=t), f"send/recv tag {t}")

# non-blocking collectives: four posted at once, run in posting order
if not use_torch:
    xs = [data(r, 5000, "float32") for r in range(size)]
    a = xs[rank].copy()
    b = xs[rank].copy() if rank == 0 else np.zeros(5000, np.float32)
    c = xs[rank].copy()
    works = [g.allreduce(a, async_op=True), g.broadcast(b, root=0, async_op=True),
             g.reduce(c, root=1 % size, op="max", async_op=True),
             g.allgather(xs[rank], async_op=True)]
    res = [w.wait(timeout=60) for w in works]
    same(res[0], ref_reduce(xs, "sum"), "iallreduce")
    same(res[1], xs[0], "ibroadcast")
    if rank == 1 % size:
        same(res[2], ref_reduce(xs, "max"), "ireduce")
    else:
        assert res[2] is None
    same(res[3], np.stack(xs), "iallgather")
    assert all(w.is_completed() for w in works)
    dropped = np.ones(100, np.float32)
    g.allreduce(dropped, async_op=True)  # never waited for: dropping it waits for it
    same(dropped, np.full(100, size, np.float32), "dropped iallreduce")

# data movement of a dtype the library cannot reduce moves as bytes
cplx = (np.arange(64) + 1j * rank).astype(np.complex64)
agc = g.allgather(cplx) if not use_torch else None
if agc is not None:
    same(agc, np.stack([(np.arange(64) + 1j * r).astype(np.complex64) for r in range(size)]),
         "allgather complex64")

# The GIL is released while a call waits: rank 0 waits in a barrier that
# the others enter only once its main thread has run 5 times after the
# barrier's thread started (and put an object saying so): a call that kept
# the GIL would stop that thread, and the others' gets would time out.
g.barrier()
if rank == 0:
    ticks = 0
    started = threading.Event()
    th = threading.Thread(target=lambda: (started.set(), g.barrier()))
    th.start()
    started.wait()
    while ticks < 5:
        ticks += 1
        time.sleep(0.001)
    flag = np.ones(1, np.uint8)
    ctx.put("coll-ranks-main-ran", flag, no_inline=True)
    th.join()
    ctx.delete("coll-ranks-main-ran")
else:
    ctx.get("coll-ranks-main-ran", np.zeros(1, np.uint8), timeout=60)
    g.barrier()

# Errors come back by code: ranks that disagree on a count get InvalidError.
try:
    g.allreduce(np.zeros(10 + (rank == 0), np.float32), timeout=20)
except conflux.InvalidError as e:
    assert e.status == -1 and e.name == "CFX_ERR_INVALID", (e.status, e.name)
else:
    print(f"rank {rank}: mismatched counts were not refused", file=sys.stderr)
    sys.exit(1)

g.barrier()
g.close()
ctx.close()
print(f"rank {rank}: ok")
