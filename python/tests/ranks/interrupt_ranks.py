"""Ctrl-C (KeyboardInterrupt) ends waits that another rank holds up, long
before their 60 s deadline, and leaves the group and the context usable:
the waits of requests, and blocking collectives, sends, receives and gets,
a group's, a context's and a parameter server's creation and a reduce of
objects.

Rank 0 is interrupted; rank 1 holds it up and learns of the interrupt
through an object rank 0 puts.  The calls' deadlines are 60 s and the
test's harness gives up sooner: a wait that ignored Ctrl-C fails the test
by the harness's timeout, not by a measured time.
"""
import signal
import sys

import numpy as np

import conflux
from sigint import interrupted, sigint_inside

ctx = conflux.Context(timeout=60)
g = conflux.Group(ctx, "sigint", timeout=60)
rank = g.rank


def fail(msg):
    sys.exit(f"rank {rank}: {msg}")


def told(name):
    """Rank 1 waits for rank 0's word (an object it puts)."""
    ctx.get(name, timeout=60)


def hears_cancel(name, x):
    """Rank 1, told, makes its side of the allreduce rank 0 canceled: it fails so."""
    told(name)
    fails_canceled(x)


def fails_canceled(x):
    """Rank 1's side of an allreduce rank 0 canceled fails saying so."""
    try:
        g.allreduce(x)
        fail("rank 0's canceled allreduce completed here")
    except conflux.PeerFailedError as e:
        if "rank 0" not in str(e) or "canceled" not in str(e):
            fail(f"rank 0's cancel, said as: {e}")


# 0. A group rank 1 never joins: Ctrl-C ends rank 0's wait in its creation.
#    A context whose coordinator does not answer (nothing listens on port 1):
#    Ctrl-C ends its wait to join (it waited out its deadline).
if rank == 0:
    interrupted("Group.__init__", conflux.Group, ctx, "lonely", rank=0, size=2, timeout=60)
    interrupted("Context.__init__", conflux.Context, coord="127.0.0.1:1", token="t" * 32,
                timeout=60)
    # a reduce of objects nobody puts: Ctrl-C ends its wait for them
    interrupted("Context.reduce_objects", ctx.reduce_objects, ["sigint/never/a", "sigint/never/b"],
                "sigint/never/r", dtype=np.float32, timeout=60)
    # a parameter-server worker whose job has no server: Ctrl-C ends its wait
    interrupted("ParameterServer.__init__", conflux.ParameterServer, ctx, "sigint-ps",
                role="worker", num_workers=1, num_servers=1, timeout=60)


# 1. A Work's wait for an allreduce rank 1 has not joined: Ctrl-C ends the
#    wait and leaves the allreduce running, as a timeout of the wait does.
x = np.full(4, rank + 1, np.float32)
if rank == 0:
    w = g.allreduce(x, async_op=True)
    interrupted("Request.wait", w.wait)
    if w.is_completed():
        fail("the allreduce completed without rank 1")
    ctx.put("work-waited", b"1")
    if not (w.wait() == 3).all():
        fail(f"the interrupted Work's allreduce gave {x}")
else:
    told("work-waited")
    g.allreduce(x)

# 2. A get_nb request's wait for an object nobody put: the same; the request
#    dropped then cancels the get.
if rank == 0:
    out = np.zeros(8, np.uint8)
    req = ctx.get_nb("never-put", out)
    interrupted("Request.wait", req.wait)
    if req.test():
        fail("a get of an object never put completed")
    del req

# 3. A blocking allreduce rank 1 has not joined: Ctrl-C cancels it, as a
#    freed request's cancel does; rank 1's side of it hears so, and the
#    group's next call pairs as usual.  (1 MiB: rank 0 cannot have sent its
#    whole part ahead, as an eager message of a small call is, with which
#    rank 1 would complete the call.)
big = np.full(256 * 1024, rank + 1, np.float32)
if rank == 0:
    interrupted("Group.allreduce", g.allreduce, big)
    ctx.put("allreduce-canceled", b"1")
else:
    hears_cancel("allreduce-canceled", big)
y = np.full(4, rank + 1, np.float32)
if not (g.allreduce(y) == 3).all():
    fail(f"the allreduce after the cancel gave {y}")

# 4. A blocking get of an object nobody put: Ctrl-C ends it (into a buffer,
#    and into the arena).
if rank == 0:
    interrupted("Context.get_into", ctx.get, "never-put", np.zeros(8, np.uint8))
    interrupted("Context.get_alloc", ctx.get, "never-put")

# 5. A signal handler that uses the group whose call it interrupts: the
#    call holds the group, so the handler gets RuntimeError (where it would
#    wait for itself), which cancels the call.
if rank == 0:
    def reenter(signum, frame):
        g.barrier()

    old = signal.signal(signal.SIGINT, reenter)
    try:
        sigint_inside("Group.allreduce")
        g.allreduce(big)
        fail("the allreduce completed without rank 1")
    except RuntimeError as e:
        if "signal handler" not in str(e):
            fail(f"the handler's call into its own group: {e}")
    finally:
        sys.setprofile(None)
        signal.signal(signal.SIGINT, old)
    ctx.put("reentered", b"1")
else:
    hears_cancel("reentered", big)

# 6. A blocking recv of a message rank 1 has not sent, and a blocking send of
#    1 MiB rank 1 has not asked for: Ctrl-C withdraws each.  The message
#    rank 1 sends after goes to rank 0's next recv of the tag, and rank 1's
#    recv gets the send rank 0 makes after, not the withdrawn one.
if rank == 0:
    small = np.zeros(1024, np.float32)
    interrupted("Group.recv", g.recv, small, 1, tag=3)
    interrupted("Group.send", g.send, np.full(256 * 1024, 7, np.float32), 1, tag=4)
    ctx.put("p2p-interrupted", b"1")
    g.recv(small, 1, tag=3)
    if not (small == 5).all():
        fail(f"the recv after the interrupted one gave {small[:4]}")
    g.send(np.full(256 * 1024, 8, np.float32), 1, tag=4)
else:
    told("p2p-interrupted")
    g.send(np.full(1024, 5, np.float32), 0, tag=3)
    got = g.recv(np.zeros(256 * 1024, np.float32), 0, tag=4)
    if not (got == 8).all():
        fail(f"the recv after rank 0's withdrawn send gave {got[:4]}")

# 7. A blocking allreduce waiting behind a Work's allreduce rank 1 has not
#    joined: Ctrl-C ends that wait too.  The interrupted call never runs:
#    the Work's completes when rank 1 joins it, and rank 1's side of the
#    interrupted one hears the cancel.
if rank == 0:
    w = g.allreduce(np.full(4, 1, np.float32), async_op=True)
    interrupted("Group.allreduce", g.allreduce, big)
    if not (big == 1).all():
        fail("the interrupted allreduce wrote its buffer")
    ctx.put("queued-interrupted", b"1")
    if not (w.wait() == 3).all():
        fail("the allreduce before the interrupted one went wrong")
else:
    told("queued-interrupted")
    if not (g.allreduce(np.full(4, 2, np.float32)) == 3).all():
        fail("the allreduce before rank 0's interrupted one went wrong")
    fails_canceled(big)

g.barrier()
g.close()
ctx.close()
print(f"rank {rank}: ok", flush=True)
