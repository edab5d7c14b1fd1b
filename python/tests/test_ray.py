"""conflux.ray on a local Ray cluster: collective groups of actors and object transfer.
Skipped when Ray is not installed."""
import os
import secrets

import numpy as np
import pytest

# Ray 2.x turns token authentication on for a local ray.init() and, given no
# token, writes one to ~/.ray/auth_token, where every later `ray start --head`
# of the user finds it (and then turns it on for clusters whose other nodes
# know nothing of it).  A token of the tests' own leaves the home directory
# as it was; set before Ray is imported, which reads these once.  Older Ray
# ignores both; a RAY_AUTH_MODE of the caller's is kept.
if "RAY_AUTH_MODE" not in os.environ:
    os.environ["RAY_AUTH_MODE"] = "token"
    os.environ["RAY_AUTH_TOKEN"] = secrets.token_hex(32)

ray = pytest.importorskip("ray")
import conflux  # noqa: E402
import conflux.ray as cr  # noqa: E402

W = 3


@pytest.fixture(scope="module")
def ray_session():
    ray.init(num_cpus=W + 1, include_dashboard=False, namespace="conflux-tests", log_to_driver=True,
             configure_logging=False)
    cr.start(timeout=60)
    yield
    ray.shutdown()
    cr.shutdown()


@pytest.fixture
def cluster(ray_session):
    """The job now running (a test may have ended the first and started another)."""
    return cr.start(timeout=60)


@ray.remote(num_cpus=1)
class Worker:
    def __init__(self, rank):
        self.rank = rank

    def join(self, job, group_name):
        cr.init_collective_group(W, self.rank, group_name=group_name, job=job)
        return cr.get_rank(group_name), cr.get_collective_group_size(group_name)

    def collectives(self, group_name):
        """Every collective, returning what arrived (checked by the driver)."""
        r = cr.get_rank(group_name)  # a declared group may rank actors otherwise
        out = {}
        x = np.arange(1000, dtype=np.float32) + r
        out["allreduce"] = cr.allreduce(x.copy(), group_name)
        out["allreduce_max"] = cr.allreduce(x.copy(), group_name, op=cr.ReduceOp.MAX)
        b = np.full(777, r, np.int64)
        out["broadcast"] = cr.broadcast(b, src_rank=1, group_name=group_name)
        red = np.arange(10, dtype=np.float64) * (r + 1)
        out["reduce"] = cr.reduce(red, dst_rank=2, group_name=group_name)
        lst = [np.zeros(5, np.int32) for _ in range(W)]
        out["allgather"] = np.stack(cr.allgather(lst, np.full(5, r, np.int32), group_name))
        rs = np.zeros(4, np.float32)
        cr.reducescatter(rs, [np.full(4, q + 10 * r, np.float32) for q in range(W)],
                         group_name)
        out["reducescatter"] = rs
        if r == 0:
            cr.send(np.arange(64, dtype=np.uint8), 1, group_name)
        elif r == 1:
            out["recv"] = cr.recv(np.zeros(64, np.uint8), 0, group_name)
        cr.barrier(group_name)
        return out

    def torch_allreduce(self, group_name):
        import torch
        t = torch.full((100,), float(self.rank + 1), dtype=torch.bfloat16)
        cr.allreduce(t, group_name)
        return t.float().numpy()

    def put(self, n, job=None):
        a = (np.arange(n, dtype=np.float64) * 0.25).reshape(-1, 4)
        self.kept = a
        return cr.put(a, job=job)

    def get(self, ref):
        return cr.get(ref, timeout=30)

    def put_kinds(self, job):
        """A non-contiguous numpy array; with torch, a transposed float32 tensor and bfloat16."""
        cr.context(job)
        self.kept_kinds = [np.arange(24, dtype=np.int32).reshape(4, 6)[:, ::2]]
        try:
            import torch
        except ImportError:
            pass
        else:
            self.kept_kinds.append(torch.arange(12, dtype=torch.float32).reshape(3, 4).t())
            self.kept_kinds.append((torch.arange(300) - 150).to(torch.bfloat16) / 8)
        return [cr.put(a) for a in self.kept_kinds]

    def put_get_0d(self, job):
        """A 0-d array keeps its shape: the ref's and the got array's."""
        cr.context(job)
        self.kept_0d = np.array(2.5, np.float64)
        ref = cr.put(self.kept_0d)
        got = cr.get(ref, timeout=30)
        return ref.shape, got.shape, got.tobytes()

    def get_kinds(self, job, refs):
        """Each object fetched as numpy, and (torch) into a tensor of its type: raw bytes."""
        cr.context(job)
        out = []
        for ref in refs:
            a = cr.get(ref, timeout=30)
            out.append((ref.dtype, a.shape, np.ascontiguousarray(a).view(np.uint8).tobytes()))
            if ref.dtype == "bfloat16" or len(refs) > 1 and ref is refs[1]:
                import torch
                dt = torch.bfloat16 if ref.dtype == "bfloat16" else torch.float32
                t = cr.get(ref, out=torch.empty(ref.shape, dtype=dt), timeout=30)
                bits = t.view(torch.int16) if dt == torch.bfloat16 else t
                out.append(("torch", tuple(t.shape), bits.numpy().tobytes()))
        if len(refs) > 1:  # with torch: into a tensor of another type (its bits as int32s)
            try:
                cr.get(refs[-1], out=torch.empty(refs[-1].shape, dtype=torch.int32), timeout=30)
            except TypeError as e:
                out.append(("refused", str(e)))
        return out

    def get_out(self, job, ref):
        """get into out= of every kind: what came back, is it out, out's bytes; or the error."""
        import torch
        cr.context(job)
        outs = [np.zeros(ref.shape, np.float64), torch.zeros(ref.shape, dtype=torch.float64),
                bytearray(8 * int(np.prod(ref.shape))),
                np.zeros((2 * ref.shape[0], ref.shape[1]), np.float64),  # larger
                np.zeros(int(np.prod(ref.shape)), np.float64),  # as many elements, flat
                np.zeros((1, 4), np.float64),  # smaller
                bytearray(8 * int(np.prod(ref.shape)) + 1)]
        res = []
        for out in outs:
            try:
                got = cr.get(ref, out=out, timeout=30)
            except ValueError as e:
                res.append(("ValueError", str(e)))
            else:
                res.append((got is out, bytes(memoryview(np.asarray(out)).cast("B"))))
        return res

    def step(self, grad, group_name):
        """The docs' Trainer.step: Ray hands the array read-only, so copy it first."""
        try:
            cr.allreduce(grad, group_name)
        except ValueError as e:
            refused = str(e)
        grad = np.array(grad)
        return refused, cr.allreduce(grad, group_name=group_name)

    def leave(self, group_name):
        cr.destroy_collective_group(group_name)
        return True

    def rank_of(self, group_name):
        """get_rank (a declared group's first call joins it), or the RuntimeError's text."""
        try:
            return cr.get_rank(group_name)
        except RuntimeError as e:
            return str(e)


def _check(outs):
    xs = [np.arange(1000, dtype=np.float32) + r for r in range(W)]
    for r, o in enumerate(outs):
        assert np.array_equal(o["allreduce"], sum(xs))
        assert np.array_equal(o["allreduce_max"], xs[-1])
        assert np.array_equal(o["broadcast"], np.full(777, 1, np.int64))
        red = np.arange(10, dtype=np.float64)
        want = red * sum(q + 1 for q in range(W)) if r == 2 else red * (r + 1)
        assert np.array_equal(o["reduce"], want)
        assert np.array_equal(o["allgather"], np.stack([np.full(5, q, np.int32) for q in range(W)]))
        assert np.array_equal(o["reducescatter"],
                              np.full(4, sum(r + 10 * q for q in range(W)), np.float32))
    assert np.array_equal(outs[1]["recv"], np.arange(64, dtype=np.uint8))


def test_groups_initialized_in_actors(cluster):
    ws = [Worker.remote(r) for r in range(W)]
    assert ray.get([w.join.remote(cluster, "g1") for w in ws], timeout=120) == [(r, W) for r in range(W)]
    _check(ray.get([w.collectives.remote("g1") for w in ws], timeout=120))
    assert all(ray.get([w.leave.remote("g1") for w in ws], timeout=60))


def test_docs_example_copies_read_only_arguments(cluster):
    """An array argument arrives read-only (zero-copy from the object store):
    an in-place allreduce says to pass a copy, and the copy is reduced."""
    ws = [Worker.remote(r) for r in range(W)]
    ray.get([w.join.remote(cluster, "g3") for w in ws], timeout=120)
    grads = [np.arange(1 << 17, dtype=np.float32) * (r + 1) for r in range(W)]
    res = ray.get([w.step.remote(g, "g3") for w, g in zip(ws, grads)], timeout=120)
    for refused, got in res:
        assert "read-only" in refused and "np.array(x)" in refused, refused
        assert got.tobytes() == sum(grads).tobytes()
    ray.get([w.leave.remote("g3") for w in ws], timeout=60)


def test_group_declared_by_driver_and_objects(cluster):
    ws = [Worker.remote(r) for r in range(W)]
    # ranks in another order than the actors
    cr.create_collective_group(ws, W, [2, 0, 1], group_name="g2", job=cluster)
    order = [None] * W
    for w, r in zip(ws, [2, 0, 1]):
        order[r] = w
    _check(ray.get([w.collectives.remote("g2") for w in order], timeout=120))
    # object transfer by id between actors: 1 MiB travels over Conflux, not Ray
    ref = ray.get(ws[0].put.remote(1 << 17))
    assert ref.shape == ((1 << 17) // 4, 4)
    got = ray.get([w.get.remote(ref) for w in ws[1:]], timeout=120)
    want = (np.arange(1 << 17, dtype=np.float64) * 0.25).reshape(-1, 4)
    for g in got:
        assert g.dtype == np.float64 and np.array_equal(g, want)
    try:
        import torch  # noqa: F401
    except ImportError:
        pass
    else:
        res = ray.get([w.torch_allreduce.remote("g2") for w in order], timeout=120)
        for r in res:
            assert np.array_equal(r, np.full(100, sum(range(1, W + 1)), np.float32))
    ray.get([w.leave.remote("g2") for w in ws], timeout=60)
    cr.destroy_collective_group("g2")


def test_errors_from_actors(cluster):
    @ray.remote
    def not_joined():
        try:
            cr.allreduce(np.zeros(3, np.float32), "nope")
        except RuntimeError as e:
            return str(e)
    assert "not initialized" in ray.get(not_joined.remote(), timeout=60)

    @ray.remote
    def bad_token(job):
        try:
            conflux.Context(coord=job.coord, token="wrong", timeout=5)
        except conflux.AuthError as e:
            return e.status
    assert ray.get(bad_token.remote(cluster), timeout=60) == -8


def test_objects_of_every_kind(cluster):
    """put copies what is not contiguous and takes torch bfloat16; the bytes arrive as they were."""
    a, b = Worker.remote(0), Worker.remote(1)
    refs = ray.get(a.put_kinds.remote(cluster), timeout=120)
    got = ray.get(b.get_kinds.remote(cluster, refs), timeout=120)
    npa = np.arange(24, dtype=np.int32).reshape(4, 6)[:, ::2]
    assert refs[0].dtype == "<i4" and refs[0].shape == (4, 3)
    assert got[0] == ("<i4", (4, 3), np.ascontiguousarray(npa).tobytes())
    assert ray.get(a.put_get_0d.remote(cluster), timeout=60) == (
        (), (), np.array(2.5, np.float64).tobytes())
    if len(refs) == 1:
        return  # no torch in this venv: the numpy case only
    import torch
    tf = torch.arange(12, dtype=torch.float32).reshape(3, 4).t().contiguous()
    tb = (torch.arange(300) - 150).to(torch.bfloat16) / 8
    assert refs[1].dtype == "<f4" and refs[1].shape == (4, 3)
    assert got[1] == ("<f4", (4, 3), tf.numpy().tobytes())
    assert got[2] == ("torch", (4, 3), tf.numpy().tobytes())
    assert refs[2].dtype == "bfloat16" and refs[2].shape == (300,)
    bits = tb.view(torch.int16).numpy().tobytes()
    assert got[3][0] == "bfloat16" and got[3][2] == bits  # ml_dtypes bfloat16 or uint16 bits
    assert got[4] == ("torch", (300,), bits)
    assert got[5][0] == "refused" and "bfloat16" in got[5][1], got[5]


def test_destroy_elsewhere_keeps_the_declared_group(cluster):
    """destroy_collective_group() in an actor that is not a member, in a member
    before its first call, or in a member a second time, leaves the driver's
    record alone: it used to remove it, and the members' next get_rank raised
    "collective group 'g4' is not initialized here"."""
    ws = [Worker.remote(r) for r in range(W)]
    outsider = Worker.remote(0)
    cr.create_collective_group(ws, W, [1, 2, 0], group_name="g4", job=cluster)
    assert ray.get(outsider.leave.remote("g4"), timeout=60)  # not a member: nothing to leave
    assert ray.get(ws[0].leave.remote("g4"), timeout=60)  # a member, before it joined
    assert ray.get([w.rank_of.remote("g4") for w in ws], timeout=120) == [1, 2, 0]
    ray.get([w.leave.remote("g4") for w in ws], timeout=60)
    ray.get([w.leave.remote("g4") for w in ws], timeout=60)  # each a second time
    # the record is still there: the members join the group again
    assert ray.get([w.rank_of.remote("g4") for w in ws], timeout=120) == [1, 2, 0]
    ray.get([w.leave.remote("g4") for w in ws], timeout=60)
    with pytest.raises(RuntimeError, match="'g4' is already declared"):
        cr.create_collective_group(ws, W, [0, 1, 2], group_name="g4", job=cluster)
    # the driver's destroy removes it: the group is gone for everyone
    cr.destroy_collective_group("g4")
    assert ray.get(ws[0].rank_of.remote("g4"), timeout=60) == \
        "collective group 'g4' is not initialized here"
    for w in ws + [outsider]:
        ray.kill(w)


def test_new_job_declares_the_same_group(cluster):
    """cr.shutdown() removes the records the driver declared: the job started
    after it declares the same group name, and its actors read the new
    record (the old one, detached, outlived the job: ActorAlreadyExistsError
    for the declaration, "not a member" for the new actors)."""
    ws = [Worker.remote(r) for r in range(W)]
    cr.create_collective_group(ws, W, [0, 1, 2], group_name="g5", job=cluster)
    assert ray.get([w.rank_of.remote("g5") for w in ws], timeout=120) == [0, 1, 2]
    ray.get([w.leave.remote("g5") for w in ws], timeout=60)
    for w in ws:  # their CPUs are the new actors'
        ray.kill(w)
    cr.shutdown()
    job = cr.start(timeout=60)
    assert job != cluster
    ws2 = [Worker.remote(r) for r in range(W)]
    cr.create_collective_group(ws2, W, [2, 1, 0], group_name="g5", job=job)
    assert ray.get([w.rank_of.remote("g5") for w in ws2], timeout=120) == [2, 1, 0]
    _check(ray.get([w.collectives.remote("g5") for w in reversed(ws2)], timeout=120))
    ray.get([w.leave.remote("g5") for w in ws2], timeout=60)
    cr.destroy_collective_group("g5")
    for w in ws2:
        ray.kill(w)


def test_get_into_out_fills_out(cluster):
    """cr.get(ref, out=...) fills out and returns it: an array or tensor of the
    put's dtype and shape, or a buffer of its size.  Another shape or size
    is a ValueError: a larger out got the bytes at its start and a numpy
    uint8 view of them back instead of out."""
    pytest.importorskip("torch")
    a, b = Worker.remote(0), Worker.remote(1)
    ref = ray.get(a.put.remote(64, cluster), timeout=60)  # (16, 4) float64
    want = (np.arange(64, dtype=np.float64) * 0.25).tobytes()
    res = ray.get(b.get_out.remote(cluster, ref), timeout=120)
    assert res[:3] == [(True, want)] * 3
    assert res[3:] == [
        ("ValueError", "get: the object has shape (16, 4), out has shape (32, 4)"),
        ("ValueError", "get: the object has shape (16, 4), out has shape (64,)"),
        ("ValueError", "get: the object has shape (16, 4), out has shape (1, 4)"),
        ("ValueError", "get: the object has 512 bytes, out has 513")]
    ray.kill(a)
    ray.kill(b)
