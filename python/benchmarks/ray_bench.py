"""Conflux through conflux.ray against Ray's own paths, measured in one run.

Runs on an existing Ray cluster whose node i carries the custom resource
"node<i>" (scripts/bench-ray.sh starts one per network namespace of
test/cluster/).  Every actor is pinned to its node, so what moves between
actors crosses that node's shaped link.  Cases:

  broadcast  one actor holds a SIZE array; K others fetch it.
             Ray: ray.put in the sender, ray.get of the ref in each receiver.
             Conflux: conflux.ray.put in the sender, conflux.ray.get of the
             handle in each receiver.  Time: from the driver's call to the
             sender (the put included) to the last receiver holding the
             whole array; every receiver then checks it byte for byte.
  allreduce  W actors sum a float32 SIZE array.
             Ray: ray.util.collective, backend "gloo" (torch.distributed's
             gloo in Ray 2.x).  Conflux: conflux.ray.allreduce.  Time: from
             the earliest rank leaving a barrier to the last rank done; every
             rank then checks every element against the exact sum.
  ps         asynchronous SGD with a parameter server, as in the Hoplite
             paper: workers compute a gradient on the weights they were
             given, the server applies whichever gradient comes first and
             hands that worker the new weights (no barrier); the server
             actor takes calls on several threads, so one gradient arrives
             while another is applied (Ray fetches arguments before a call
             anyway; the Conflux variant fetches inside it, one gradient at
             a time).  The driver
             loop is Ray's (ray.wait on the workers' results) in both
             variants; the weights and gradients travel as Ray objects, or
             as Conflux objects whose small handles travel through Ray.
             Every transfer is checked with the CRC-32 of its bytes.

Prints one JSON object per measurement on stdout (medians, every sample,
and the ratio Ray/Conflux, i.e. how many times faster Conflux was) and a
table on stderr; exits 1 when a check fails or a case errors.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import zlib

import numpy as np
import ray

import conflux.ray as cr

GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(s[:-1]) * mult[s[-1].upper()] if s[-1].upper() in mult else int(s)


def pattern(nbytes: int, seed: int) -> np.ndarray:
    """nbytes (a multiple of 8) that differ per seed and per position."""
    a = np.arange(nbytes // 8, dtype=np.uint64)
    a *= GOLDEN
    a ^= np.uint64(seed) * np.uint64(0x100000001B3)
    return a


@ray.remote(num_cpus=0)
class Node:
    """One per Ray node; every case's actor."""

    def __init__(self, index: int):
        self.index = index
        self.arr = None
        self.ref = None
        self.expect_seed = None
        self.expect = None

    def where(self, job):
        cr.context(job)  # this process's Conflux context, joined to the job
        return self.index, ray.util.get_node_ip_address(), os.uname().nodename

    # -- broadcast -------------------------------------------------------------------
    def bcast_prepare(self, nbytes: int, seed: int) -> bool:
        self.arr = pattern(nbytes, seed)
        return True

    def bcast_ray_put(self):
        self.ref = ray.put(self.arr)
        return [self.ref]  # in a list: Ray hands the ref itself, not its value

    def bcast_cfx_put(self):
        self.ref = cr.put(self.arr)
        return self.ref

    def bcast_release(self, kind: str) -> bool:
        if kind == "conflux" and self.ref is not None:
            cr.delete(self.ref)
        self.ref = None
        self.arr = None
        return True

    def _check(self, a: np.ndarray, nbytes: int, seed: int) -> bool:
        if self.expect_seed != (nbytes, seed):
            self.expect, self.expect_seed = pattern(nbytes, seed), (nbytes, seed)
        return a.dtype == np.uint64 and np.array_equal(a, self.expect)

    def bcast_ray_get(self, refs, nbytes: int, seed: int):
        a = ray.get(refs[0], timeout=300)
        done = time.monotonic()
        ok = self._check(a, nbytes, seed)
        del a
        return done, ok

    def bcast_cfx_get(self, ref, nbytes: int, seed: int):
        a = cr.get(ref, timeout=300)
        done = time.monotonic()
        ok = self._check(a, nbytes, seed)
        del a
        return done, ok

    # -- allreduce -------------------------------------------------------------------
    def ar_join(self, kind: str, world: int, rank: int, job) -> bool:
        if kind == "ray":
            import ray.util.collective as col
            col.init_collective_group(world, rank, backend="gloo", group_name="bench_gloo",
                                      gloo_timeout=300000)
        else:
            cr.init_collective_group(world, rank, group_name="bench_cfx", job=job)
        self.rank, self.world = rank, world
        return True

    def ar_step(self, kind: str, nbytes: int, it: int):
        n = nbytes // 4
        base = (np.arange(n, dtype=np.int64) % 4096).astype(np.float32)
        x = base + np.float32(self.rank + it)
        if kind == "ray":
            import torch
            import ray.util.collective as col
            t = torch.from_numpy(x)  # shares x's memory
            col.barrier("bench_gloo")
            t0 = time.monotonic()
            col.allreduce(t, "bench_gloo")
            t1 = time.monotonic()
        else:
            cr.barrier("bench_cfx")
            t0 = time.monotonic()
            cr.allreduce(x, "bench_cfx")
            t1 = time.monotonic()
        w = self.world
        want = base * np.float32(w) + np.float32(w * (w - 1) // 2 + w * it)  # exact in float32
        return t0, t1, bool(np.array_equal(x, want))

    def ar_leave(self, kind: str) -> bool:
        if kind == "ray":
            import ray.util.collective as col
            col.destroy_collective_group("bench_gloo")
        else:
            cr.destroy_collective_group("bench_cfx")
        return True

    # -- parameter server (asynchronous SGD) -----------------------------------------
    # Loss 0.5 * ||w - target||^2 per sample: the gradient is w - target; the
    # server steps w -= lr * g.  Deterministic, so the bytes can be checked.
    def ps_setup(self, nbytes: int, lr: float, workers: int) -> bool:
        n = nbytes // 4
        self.target = (np.arange(n, dtype=np.int64) % 977).astype(np.float32)
        self.w = np.zeros(n, np.float32)
        self.lr = np.float32(lr)
        self.workers = workers
        self.versions = {}  # conflux: weight handle id -> (handle, workers yet to fetch it)
        self.grad = None
        self.bad = 0
        self.lock = threading.Lock()  # the server runs its calls on several threads
        self.fetch_lock = threading.Lock()
        self.spent = {}  # phase -> seconds, per call: where the time goes
        return True

    def _spent(self, phase: str, t0: float) -> float:
        t1 = time.monotonic()
        self.spent.setdefault(phase, []).append(t1 - t0)
        return t1

    def ps_spent(self):
        return {k: statistics.median(v) for k, v in self.spent.items()}

    def ps_bad(self) -> int:
        return self.bad

    # Ray: arrays travel as Ray objects (arguments and return values)
    def ps_ray_init(self):
        return self.w, zlib.crc32(self.w)

    def ps_ray_compute(self, wmsg):
        w, crc = wmsg
        if zlib.crc32(w) != crc:
            self.bad += 1
        g = w - self.target
        return g, zlib.crc32(g)

    def ps_ray_apply(self, gmsg):
        g, crc = gmsg  # Ray fetched it before the call
        ok = zlib.crc32(g) == crc
        with self.lock:
            self.bad += not ok
            self.w = w = self.w - self.lr * g
        return w, zlib.crc32(w)

    # Conflux: arrays travel as Conflux objects; Ray carries their handles
    def ps_cfx_init(self):
        ref = cr.put(self.w)
        self.versions[ref.id_hex] = [ref, self.workers]
        return ref, zlib.crc32(self.w)

    def ps_cfx_compute(self, wmsg):
        t = time.monotonic()
        if self.grad is not None:  # the server applied it before this call was made
            cr.delete(self.grad)
            t = self._spent("worker delete", t)
        wref, crc = wmsg
        w = cr.get(wref, timeout=300)
        t = self._spent("worker get", t)
        if zlib.crc32(w) != crc:
            self.bad += 1
        g = w - self.target
        t = self._spent("worker compute", t)
        self.grad = cr.put(g)
        self._spent("worker put", t)
        return self.grad, zlib.crc32(g), wref.id_hex

    def ps_cfx_apply(self, gmsg):
        gref, crc, fetched = gmsg
        # fetched outside the update's lock, as Ray fetches an argument before
        # the call, so the next gradient arrives while this one is applied;
        # but one at a time, each at the link's full rate: gradients fetched
        # together share the link, finish together, and their workers then
        # fetch their weights together, so the server's link carries
        # gradients in and weights out by turns instead of both at once
        t = time.monotonic()
        with self.fetch_lock:
            g = cr.get(gref, timeout=300)
        t = self._spent("server get", t)
        ok = zlib.crc32(g) == crc
        with self.lock:  # the update; checks and deletes outside it, as for Ray
            self.bad += not ok
            v = self.versions[fetched]  # that worker has fetched this version
            v[1] -= 1
            old = v[0] if v[1] == 0 else None
            if old is not None:
                del self.versions[fetched]
            self.w = w = self.w - self.lr * g  # a new array: a put buffer must not change
            ref = cr.put(w)
            self.versions[ref.id_hex] = [ref, 1]
        t = self._spent("server update", t)
        if old is not None:
            cr.delete(old)
            self._spent("server delete", t)
        return ref, zlib.crc32(w)

    def ps_cfx_end(self) -> bool:
        for ref, _ in self.versions.values():
            cr.delete(ref)
        self.versions = {}
        if self.grad is not None:
            cr.delete(self.grad)
            self.grad = None
        return True


# -- the driver's side of each case ----------------------------------------------------

def bcast_once(kind, sender, receivers, nbytes, seed):
    ray.get(sender.bcast_prepare.remote(nbytes, seed))
    t0 = time.monotonic()
    if kind == "ray":
        refs = ray.get(sender.bcast_ray_put.remote())
        res = ray.get([r.bcast_ray_get.remote(refs, nbytes, seed) for r in receivers], timeout=600)
        del refs
    else:
        ref = ray.get(sender.bcast_cfx_put.remote())
        res = ray.get([r.bcast_cfx_get.remote(ref, nbytes, seed) for r in receivers], timeout=600)
    ray.get(sender.bcast_release.remote(kind))
    return max(d for d, _ in res) - t0, all(ok for _, ok in res)


def allreduce_once(kind, actors, nbytes, it):
    res = ray.get([a.ar_step.remote(kind, nbytes, it) for a in actors], timeout=600)
    return max(t1 for _, t1, _ in res) - min(t0 for t0, _, _ in res), all(ok for *_, ok in res)


def ps_run(kind, server, workers, nbytes, lr, steps, warmup):
    """steps updates after warmup ones; returns (seconds, every CRC matched)."""
    ray.get([a.ps_setup.remote(nbytes, lr, len(workers)) for a in [server, *workers]])
    compute = "ps_ray_compute" if kind == "ray" else "ps_cfx_compute"
    apply = "ps_ray_apply" if kind == "ray" else "ps_cfx_apply"
    init = "ps_ray_init" if kind == "ray" else "ps_cfx_init"
    w = getattr(server, init).remote()
    pending = {getattr(wk, compute).remote(w): wk for wk in workers}
    t0 = None
    for step in range(warmup + steps):
        if step == warmup:
            t0 = time.monotonic()
        [done], _ = ray.wait(list(pending), num_returns=1, timeout=600)
        wk = pending.pop(done)
        w = getattr(server, apply).remote(done)
        pending[getattr(wk, compute).remote(w)] = wk
    ray.get(w, timeout=600)  # the last update applied
    elapsed = time.monotonic() - t0
    ray.get(list(pending), timeout=600)
    bad = sum(ray.get([a.ps_bad.remote() for a in [server, *workers]]))
    for a in (server, workers[0]):
        for phase, sec in sorted(ray.get(a.ps_spent.remote()).items()):
            print(f"# ps {kind}: {phase} {sec * 1e3:.1f} ms (median)", file=sys.stderr)
    if kind == "conflux":
        ray.get([a.ps_cfx_end.remote() for a in [server, *workers]])
    return elapsed, bad == 0


def median(xs):
    return statistics.median(xs) if xs else float("nan")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--address", required=True, help="Ray cluster address (head:port)")
    p.add_argument("--nodes", type=int, required=True, help="Ray nodes node0..node<N-1>")
    p.add_argument("--cases", default="broadcast,allreduce,ps")
    p.add_argument("--size", default="64M", help="broadcast and allreduce array size")
    p.add_argument("--receivers", default="3,7", help="broadcast receiver counts")
    p.add_argument("--ranks", default="4", help="allreduce group sizes")
    p.add_argument("--iters", type=int, default=3)
    p.add_argument("--warmup", type=int, default=1)
    p.add_argument("--ps-size", default="16M", help="parameter-server model size")
    p.add_argument("--ps-workers", type=int, default=3)
    p.add_argument("--ps-steps", type=int, default=20)
    p.add_argument("--ps-batch", type=int, default=64, help="samples per gradient")
    p.add_argument("--order", default="ray,conflux", help="which side runs first")
    args = p.parse_args()

    size, ps_size = parse_size(args.size), parse_size(args.ps_size)
    cases = args.cases.split(",")
    order = args.order.split(",")
    receivers = [int(k) for k in args.receivers.split(",") if k]
    ranks = [int(k) for k in args.ranks.split(",") if k]
    need = max([2]
               + ([k + 1 for k in receivers] if "broadcast" in cases else [])
               + (ranks if "allreduce" in cases else [])
               + ([args.ps_workers + 1] if "ps" in cases else []))
    if need > args.nodes:
        print(f"ray_bench: the cases need {need} nodes, the cluster has {args.nodes}",
              file=sys.stderr)
        return 2

    ray.init(address=args.address, namespace="conflux-bench", log_to_driver=True)
    deadline = time.monotonic() + 180
    while sum(1 for n in ray.nodes() if n["Alive"]) < args.nodes:  # workers still joining
        if time.monotonic() > deadline:
            print(f"ray_bench: {args.nodes} Ray nodes did not join within 180 s", file=sys.stderr)
            return 1
        time.sleep(0.5)
    job = cr.start(timeout=120)
    actors = [Node.options(resources={f"node{i}": 0.01}).remote(i) for i in range(args.nodes)]
    where = ray.get([a.where.remote(job) for a in actors], timeout=300)
    for i, ip, host in where:
        print(f"# actor {i}: Ray node {ip} ({host})", file=sys.stderr)
    if len({ip for _, ip, _ in where}) != args.nodes:
        print("ray_bench: actors are not one per node", file=sys.stderr)
        return 1

    failed = False
    rows = []

    def report(case, ray_s, cfx_s, ok, unit="s", extra=None):
        nonlocal failed
        r, c = median(ray_s), median(cfx_s)
        rec = {"case": case, "unit": unit, "ray": r, "conflux": c, "ray_samples": ray_s,
               "conflux_samples": cfx_s, "ok": ok, **(extra or {})}
        if unit == "s":
            rec["ray_over_conflux"] = r / c
        else:  # throughput: higher is better
            rec["conflux_over_ray"] = c / r
        print(json.dumps(rec), flush=True)
        rows.append(rec)
        failed |= not ok

    if "broadcast" in cases:
        for k in receivers:
            times = {"ray": [], "conflux": []}
            ok = True
            for it in range(args.warmup + args.iters):
                for kind in order:
                    t, good = bcast_once(kind, actors[0], actors[1:k + 1], size, it * 10 + k)
                    ok &= good
                    if it >= args.warmup:
                        times[kind].append(t)
                    print(f"# broadcast 1->{k} {kind} it {it}: {t * 1e3:.0f} ms"
                          f"{'' if good else ' WRONG'}", file=sys.stderr)
            report(f"broadcast {size >> 20} MiB 1->{k}", times["ray"], times["conflux"], ok)

    if "allreduce" in cases:
        for w in ranks:
            group = actors[:w]
            times = {"ray": [], "conflux": []}
            ok = True
            ray.get([a.ar_join.remote(kind, w, r, job) for kind in order
                     for r, a in enumerate(group)], timeout=600)
            for it in range(args.warmup + args.iters):
                for kind in order:
                    t, good = allreduce_once(kind, group, size, it)
                    ok &= good
                    if it >= args.warmup:
                        times[kind].append(t)
                    print(f"# allreduce {w} ranks {kind} it {it}: {t * 1e3:.0f} ms"
                          f"{'' if good else ' WRONG'}", file=sys.stderr)
            ray.get([a.ar_leave.remote(kind) for kind in order for a in group], timeout=300)
            report(f"allreduce {size >> 20} MiB {w} ranks", times["ray"], times["conflux"], ok,
                   extra={"ray_backend": "gloo (torch.distributed)"})

    if "ps" in cases:
        # the server on node 0 takes its calls on several threads (Ray's
        # max_concurrency), so that receiving one gradient overlaps applying another
        server = Node.options(resources={"node0": 0.01},
                              max_concurrency=args.ps_workers + 1).remote(0)
        ray.get(server.where.remote(job), timeout=300)
        workers = actors[1:args.ps_workers + 1]
        tput = {"ray": [], "conflux": []}
        ok = True
        for it in range(args.iters):  # each run starts over; its first W updates are warm-up
            for kind in order:
                el, good = ps_run(kind, server, workers, ps_size, 0.01, args.ps_steps,
                                  args.ps_workers)
                ok &= good
                tput[kind].append(args.ps_steps * args.ps_batch / el)
                print(f"# ps {kind} run {it}: {args.ps_steps} updates in {el:.2f} s"
                      f"{'' if good else ' WRONG'}", file=sys.stderr)
        report(f"async SGD PS {ps_size >> 20} MiB model, {args.ps_workers} workers",
               tput["ray"], tput["conflux"], ok, unit="samples/s",
               extra={"batch": args.ps_batch, "updates": args.ps_steps})
        ray.kill(server)

    print("| case | Ray | Conflux | Conflux speed-up | checked |", file=sys.stderr)
    print("|---|---:|---:|---:|---|", file=sys.stderr)
    for r in rows:
        if r["unit"] == "s":
            print(f"| {r['case']} | {r['ray'] * 1e3:.0f} ms | {r['conflux'] * 1e3:.0f} ms "
                  f"| {r['ray_over_conflux']:.2f}x | {'ok' if r['ok'] else 'WRONG'} |",
                  file=sys.stderr)
        else:
            print(f"| {r['case']} | {r['ray']:.0f} {r['unit']} | {r['conflux']:.0f} {r['unit']} "
                  f"| {r['conflux_over_ray']:.2f}x | {'ok' if r['ok'] else 'WRONG'} |",
                  file=sys.stderr)
    for a in actors:
        ray.kill(a)
    cr.shutdown()
    ray.shutdown()
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
