"""Objects: ids, put/get into every kind of buffer, delete, reduce, and errors by code."""
import os
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest

import conflux
from conftest import have_torch


def test_object_ids():
    a = conflux.ObjectId.from_name("weights/layer1")
    assert a == conflux.ObjectId.from_name("weights/layer1")
    assert a != conflux.ObjectId.from_name("weights/layer2")
    assert len(bytes(a)) == 20 and len(a.hex) == 40
    assert conflux.ObjectId.from_hex(a.hex) == a
    assert conflux.ObjectId(bytes(a)) == a
    with pytest.raises(conflux.InvalidError) as ei:
        conflux.ObjectId.from_hex("xyz")
    assert ei.value.status == -1 and ei.value.name == "CFX_ERR_INVALID"
    assert isinstance(ei.value, ValueError) and ei.value.detail
    with pytest.raises(ValueError):
        conflux.ObjectId(b"short")
    # an int is not 20 bytes (bytes(20) would be the all-zero id), a str is a name
    for bad in (20, 5, True, "weights"):
        with pytest.raises(TypeError):
            conflux.ObjectId(bad)
    with pytest.raises(TypeError):
        conflux.ObjectId.from_name(b"weights")


def test_names_with_a_nul_are_refused(ctx):
    # the C layer reads a name up to its first NUL: "w\0a" and "w\0b" were
    # both the id of "w", so a get of one returned the other's bytes
    for bad in ("weights\x00layer1", "\x00"):
        with pytest.raises(ValueError, match="NUL"):
            conflux.ObjectId.from_name(bad)
        with pytest.raises(ValueError, match="NUL"):
            ctx.put(bad, np.arange(3.0))
    with pytest.raises(ValueError, match="NUL"):
        conflux.ObjectId.from_hex("ab" * 20 + "\x00")
    assert conflux.ObjectId.from_name("weights") != conflux.ObjectId.from_name("weights2")

def test_int_id_refused(ctx):
    a = np.arange(3, dtype=np.float64)
    with pytest.raises(TypeError):
        ctx.put(20, a)
    with pytest.raises(TypeError):
        ctx.get(20, timeout=0)
    # said as an id ("cannot convert 'NoneType' object to bytes" did not say which)
    with pytest.raises(TypeError, match="^an object id is an ObjectId, a name .* not NoneType"):
        ctx.put(None, a)
    assert ctx.put_ids() == []


def test_group_rank_and_size_are_ints(ctx):
    """A float rank or size is a TypeError naming the argument ("'float' object cannot
    be interpreted as an integer" did not say which)."""
    for kw, what in (({"rank": 0.0, "size": 1}, "rank"), ({"rank": 0, "size": 1.0}, "size")):
        with pytest.raises(TypeError, match=f"^{what} must be an int, not float"):
            conflux.Group(ctx, "floats", **kw)


def test_every_status_has_a_class():
    names = [n for n in dir(conflux) if n.endswith("Error") and n != "Error"]
    classes = {getattr(conflux, n).STATUS: getattr(conflux, n) for n in names
               if hasattr(getattr(conflux, n), "STATUS")}
    assert sorted(classes) == list(range(-22, 0))
    assert all(issubclass(c, conflux.Error) for c in classes.values())
    assert issubclass(conflux.TimeoutError, TimeoutError)
    assert issubclass(conflux.ConnectError, ConnectionError)


def test_errors_made_by_hand_have_the_attributes():
    """A raised error carries status, name, text and detail; one made by hand
    (a test double, a wrapper re-raising) has its class's, detail empty."""
    e = conflux.TimeoutError("x")
    assert (e.status, e.name, e.text, e.detail) == (-3, "CFX_ERR_TIMEOUT", "timed out", "")
    assert e.status == conflux.TimeoutError.STATUS and str(e) == "x"
    for n in dir(conflux):
        cls = getattr(conflux, n)
        if isinstance(cls, type) and issubclass(cls, conflux.Error) and cls is not conflux.Error:
            e = cls()
            assert e.status == cls.STATUS and e.name == conflux._conflux.errname(cls.STATUS)
            assert e.text == conflux._conflux.strerror(cls.STATUS) and e.detail == ""
    e = conflux.Error("x")
    assert (e.status, e.name, e.detail) == (-22, "CFX_ERR_INTERNAL", "")
    # a raised one's own attributes win over the class's
    with pytest.raises(conflux.InvalidError) as ei:
        conflux.ObjectId.from_hex("zz")
    assert ei.value.status == -1 and ei.value.detail and conflux.InvalidError.detail == ""

def test_every_status_class_is_named_for_type_checkers():
    """The classes are made at import; type checkers see only the names written
    out: each one in conflux/__init__.py as "X as X" (a re-export under mypy
    --strict, which refused conflux.TimeoutError before) and in the stub."""
    import ast
    from pathlib import Path
    made = {n for n in dir(conflux._conflux)
            if n.endswith("Error") and n != "Error"
            and isinstance(getattr(conflux._conflux, n), type)}
    pkg = Path(conflux.__file__).resolve().parent
    src = Path(__file__).resolve().parents[1] / "src" / "conflux"

    def source(name):
        return ((src if (src / name).is_file() else pkg) / name).read_text()

    init = ast.parse(source("__init__.py"))
    named = {a.name for node in ast.walk(init) if isinstance(node, ast.ImportFrom)
             and node.module == "_conflux" for a in node.names
             if a.name.endswith("Error") and a.asname == a.name}
    assert named == made
    stub = ast.parse(source("_conflux.pyi"))
    stubbed = {c.name for c in stub.body
               if isinstance(c, ast.ClassDef) and c.name.endswith("Error")}
    assert stubbed - {"Error"} == made


@pytest.mark.parametrize("nbytes", [0, 1, 4064, 65536, 65537, 3 << 20])
def test_put_get_roundtrip(ctx, nbytes):
    rng = np.random.default_rng(nbytes)
    src = rng.integers(0, 256, nbytes, dtype=np.uint8)
    oid = ctx.put(f"rt/{nbytes}", src)
    # a new array over arena memory
    got = ctx.get(oid)
    assert got.dtype == np.uint8 and np.array_equal(got, src)
    # into a preallocated array of another dtype and shape
    if nbytes % 4 == 0 and nbytes:
        out = np.zeros((nbytes // 4,), np.float32)
        r = ctx.get(oid, out=out)
        assert r is out and np.array_equal(out.view(np.uint8), src)
    # into a bytearray
    ba = bytearray(nbytes)
    ctx.get(oid, out=ba)
    assert bytes(ba) == src.tobytes()
    ctx.delete(oid)


def test_get_typed(ctx):
    src = np.arange(6 * 7, dtype=np.float64).reshape(6, 7) * 0.5
    ctx.put("typed", src)
    got = ctx.get("typed", dtype=np.float64, shape=(6, 7))
    assert got.shape == (6, 7) and np.array_equal(got, src)
    got2 = ctx.get("typed", dtype="float64", shape=42)
    assert np.array_equal(got2, src.reshape(-1))
    # a shape or dtype the object's bytes do not make: named with its size
    with pytest.raises(ValueError, match=r"'typed' has 336 bytes, which do not make an array "
                       r"of float64 of shape \(5, 7\)"):
        ctx.get("typed", dtype=np.float64, shape=(5, 7))
    with pytest.raises(ValueError, match="'typed' has 336 bytes, which do not make an array "
                       r"of \|S5"):
        ctx.get("typed", dtype="S5")  # 5-byte items: 336 is no multiple of them
    ctx.delete("typed")


def test_get_into_larger_buffer(ctx):
    src = np.arange(100, dtype=np.uint8)
    ctx.put("small", src)
    out = np.full(300, 7, np.uint8)
    r = ctx.get("small", out=out)
    assert r.nbytes == 100 and np.array_equal(r, src) and np.all(out[100:] == 7)
    ctx.delete("small")


def test_put_pins_buffer_until_delete(ctx):
    import sys
    a = np.arange(10000, dtype=np.int32)
    before = sys.getrefcount(a)
    oid = ctx.put("pinned", a)
    assert sys.getrefcount(a) == before + 1  # the exported buffer holds the array
    assert bytes(oid) in ctx.put_ids()
    del a  # the library still serves it: the memory stays valid
    assert np.array_equal(ctx.get("pinned", dtype=np.int32), np.arange(10000, dtype=np.int32))
    b = np.arange(10, dtype=np.int32)
    before = sys.getrefcount(b)
    ctx.put("pinned2", b)
    ctx.delete("pinned2")
    assert sys.getrefcount(b) == before  # released by delete
    ctx.delete("pinned")
    assert ctx.put_ids() == []


def test_put_whose_export_cannot_be_kept_is_undone(ctx):
    """A put that succeeded in the library but could not record its buffer's export (out
    of memory) withdraws the object before it raises: the library never serves a buffer
    whose export was released (a bytearray resized, freed memory sent to getters)."""
    testcapi = pytest.importorskip("_testcapi")
    low_put = conflux._conflux.Context.put
    # five records fill the smallest dict: the next one allocates a larger table
    kept = [ctx.put(f"put-nomem-kept-{i}", b"kept") for i in range(5)]
    buf = bytearray(b"conflux!" * 16)
    failures = 0
    for n in range(400):
        oid = conflux.ObjectId.from_name(f"put-nomem-{n}")
        raw = bytes(oid)
        testcapi.set_nomemory(n, n + 1)  # the n-th allocation from here fails
        try:
            low_put(ctx, raw, buf)
        except MemoryError:
            failures += 1
            testcapi.remove_mem_hooks()
            assert raw not in ctx.put_ids()
            buf.append(0)  # the export was released: the buffer is the caller's again
            del buf[-1]
            with pytest.raises(conflux.TimeoutError):  # and nothing was left published
                ctx.get(oid, timeout=0.2)
            continue
        finally:
            testcapi.remove_mem_hooks()
        assert bytes(ctx.get(oid)) == bytes(buf)
        ctx.delete(oid)
        break
    else:
        pytest.fail("every put ran out of memory")
    assert failures >= 3  # the key, the capsule and the record each failed once
    for oid in kept:
        ctx.delete(oid)
    assert ctx.put_ids() == []


def test_errors_by_code(ctx):
    ctx.put("dup", b"abc")
    with pytest.raises(conflux.ExistsError) as ei:
        ctx.put("dup", b"xyz")
    assert ei.value.status == -6
    with pytest.raises(conflux.TruncatedError) as ei:
        ctx.get("dup", out=bytearray(2))
    assert ei.value.status == -17
    ctx.delete("dup")
    with pytest.raises(conflux.NotFoundError):
        ctx.delete("dup")
    with pytest.raises(conflux.TimeoutError) as ei:
        ctx.get("never-put", timeout=0.2)
    assert ei.value.status == -3 and "never" not in ei.value.name and ei.value.detail
    with pytest.raises(ValueError):
        ctx.get("x", timeout=-1)


def test_closed_context(coord):
    """ClosedError of a closed context or group carries status, name, text and detail as every conflux.Error does."""
    c = conflux.Context(coord=coord.address, token=coord.token, timeout=10)
    g = conflux.Group(c, "closed", rank=0, size=1)
    g.close()
    c.close()
    calls = [(lambda: c.put("x", b"1"), "the context is closed"),
             (lambda: c.node_id, "the context is closed"),
             (lambda: conflux.Group(c, "late", rank=0, size=1), "the context is closed"),
             (lambda: g.barrier(), "the group is closed"),
             (lambda: g.rank, "the group is closed")]
    for call, detail in calls:
        with pytest.raises(conflux.ClosedError) as ei:
            call()
        e = ei.value
        assert (e.status, e.name, e.detail) == (-14, "CFX_ERR_CLOSED", detail), vars(e)
        assert e.status == conflux.ClosedError.STATUS and e.text
        assert str(e) == f"CFX_ERR_CLOSED: {e.text} ({detail})"


def test_wrong_token(coord):
    with pytest.raises(conflux.AuthError) as ei:
        conflux.Context(coord=coord.address, token="not-the-token", timeout=5)
    assert ei.value.status == -8


def test_two_contexts_and_threads(coord):
    """A second node gets the object over the data plane; gets run in threads at once."""
    kw = dict(coord=coord.address, token=coord.token, timeout=20)
    with conflux.Context(**kw) as a, conflux.Context(**kw) as b:
        big = np.random.default_rng(1).random(1 << 19).astype(np.float32)  # 2 MiB
        a.put("big", big)
        outs = [np.zeros_like(big) for _ in range(3)]
        ths = [threading.Thread(target=b.get, args=("big",), kwargs={"out": o}) for o in outs]
        for t in ths:
            t.start()
        for t in ths:
            t.join(30)
        for o in outs:
            assert np.array_equal(o, big)
        assert b.stats()["bytes_received"] >= big.nbytes
        a.delete("big")


def test_out_buffer_is_the_callers_on_return(coord):
    """get(out=...) keeps no copy in ``out``: changed or freed right after,
    no later get anywhere sees it.  An array over arena memory is the
    node's copy and cannot be written."""
    kw = dict(coord=coord.address, token=coord.token, timeout=20)
    with conflux.Context(**kw) as a, conflux.Context(**kw) as b, \
            conflux.Context(**kw) as c:
        src = np.random.default_rng(2).integers(0, 256, 3 << 20, dtype=np.uint8)
        a.put("mine", src)
        out = np.zeros_like(src)
        b.get("mine", out=out)
        assert np.array_equal(out, src)
        out[:] = 0xEE
        del out
        assert np.array_equal(c.get("mine", out=np.zeros_like(src)), src)
        assert np.array_equal(b.get("mine", out=np.zeros_like(src)), src)
        with pytest.raises(conflux.NotFoundError):
            b.delete("mine")  # node b kept nothing
        got = c.get("mine")
        assert not got.flags.writeable
        with pytest.raises(ValueError):
            got[0] = 1
        del got
        a.delete("mine")


def test_arena_array_outlives_context(coord):
    c = conflux.Context(coord=coord.address, token=coord.token, timeout=10)
    c.put("keep", np.arange(256, dtype=np.uint8))
    got = c.get("keep")
    c.close()  # the array still refers to arena memory: destroyed after it
    assert c.closed and np.array_equal(got, np.arange(256, dtype=np.uint8))
    del got


def test_token_from_environment_leaves_os_environ(coord, monkeypatch):
    """A token taken from $CFX_TOKEN leaves os.environ too, so a child started
    with env=dict(os.environ) does not get it; a second context still joins."""
    import os
    import subprocess
    import sys
    monkeypatch.setenv("CFX_TOKEN", coord.token)
    with conflux.Context(coord=coord.address, timeout=20) as a:
        assert "CFX_TOKEN" not in os.environ
        out = subprocess.run([sys.executable, "-c",
                              "import os; print(os.environ.get('CFX_TOKEN', '-'))"],
                             env=dict(os.environ), capture_output=True, text=True, check=True)
        assert out.stdout.strip() == "-"
        with conflux.Context(coord=coord.address, timeout=20) as b:
            a.put("tok-env", np.arange(16, dtype=np.uint8))
            assert np.array_equal(b.get("tok-env", out=np.zeros(16, np.uint8)),
                                  np.arange(16, dtype=np.uint8))
            a.delete("tok-env")


def test_array_outlives_its_objects_delete(coord):
    """An array get() returned stays the caller's after delete() of its
    object on the same node: the next get gets other memory and the first
    array's bytes stay as they were."""
    kw = dict(coord=coord.address, token=coord.token, timeout=20)
    with conflux.Context(**kw) as a, conflux.Context(**kw) as b:
        a.put("del-x", np.full(1 << 20, 1, np.uint8), no_inline=True)
        a.put("del-y", np.full(1 << 20, 2, np.uint8), no_inline=True)
        x = b.get("del-x")
        b.delete("del-x")
        y = b.get("del-y")
        assert x.ctypes.data != y.ctypes.data
        assert (x == 1).all() and (y == 2).all()
        del x
        assert (b.get("del-x") == 1).all()
        del y
        a.delete("del-x")
        a.delete("del-y")


def test_reduce_objects(coord):
    kw = dict(coord=coord.address, token=coord.token, timeout=20)
    ctxs = [conflux.Context(**kw) for _ in range(3)]
    try:
        n = 300000
        ins = [(np.arange(n) % 11 + i).astype(np.float32) for i in range(3)]
        ids = [c.put(f"red/in{i}", ins[i], no_inline=True) for i, c in enumerate(ctxs)]
        used = ctxs[0].reduce_objects(ids, "red/sum", dtype=np.float32, op="sum")
        assert sorted(used) == [0, 1, 2]
        got = ctxs[1].get("red/sum", dtype=np.float32)
        assert np.array_equal(got, ins[0] + ins[1] + ins[2])
        used = ctxs[2].reduce_objects(ids, "red/max2", dtype="float32", op="max", k=2)
        assert len(used) == 2
        want = np.maximum(ins[used[0]], ins[used[1]])
        assert np.array_equal(ctxs[2].get("red/max2", dtype=np.float32), want)
        # the result produced on a node of the caller's choice, a holder
        used = ctxs[0].reduce_objects(ids, "red/on1", dtype=np.float32, nodes=[ctxs[1].node_id])
        assert sorted(used) == [0, 1, 2]
        assert np.array_equal(ctxs[2].get("red/on1", dtype=np.float32), ins[0] + ins[1] + ins[2])
        # a node holding none of the inputs cannot produce it
        other = conflux.Context(**kw)
        try:
            with pytest.raises(conflux.Error) as ei:
                ctxs[0].reduce_objects(ids, "red/nowhere", dtype=np.float32,
                                       nodes=[other.node_id])
            assert ei.value.name == "CFX_ERR_NO_RESOURCE" and "node set" in ei.value.detail
        finally:
            other.close()
        with pytest.raises(ValueError):
            ctxs[0].reduce_objects(ids, "red/none", dtype=np.float32, nodes=[])
    finally:
        for c in ctxs:
            c.close()


def test_reduce_objects_allreduce(coord, monkeypatch):
    # the contexts share a host: striping is forced, as across hosts by default
    monkeypatch.setenv("CFX_REDUCE_SHAPE", "striped")
    kw = dict(coord=coord.address, token=coord.token, timeout=20)
    ctxs = [conflux.Context(**kw) for _ in range(3)]
    try:
        n = 1 << 20
        ins = [(np.arange(n) % 7 + 3 * i).astype(np.float32) for i in range(3)]
        ids = [c.put(f"allred/in{i}", ins[i], no_inline=True, chunk_size=65536)
               for i, c in enumerate(ctxs)]
        used = ctxs[0].reduce_objects(ids, "allred/sum", dtype=np.float32, allreduce=True)
        assert sorted(used) == [0, 1, 2]
        for c in ctxs:  # each holder reads its own copy
            local = c.stats()["gets_local"]
            assert np.array_equal(c.get("allred/sum", dtype=np.float32), ins[0] + ins[1] + ins[2])
            assert c.stats()["gets_local"] == local + 1
    finally:
        for c in ctxs:
            c.close()


@pytest.mark.parametrize("no_inline", [False, True])
def test_reduce_objects_empty(coord, no_inline):
    """Empty inputs reduce to an empty result (it failed with 'node N, which
    produces the result, died', N the caller's own live node)."""
    kw = dict(coord=coord.address, token=coord.token, timeout=20)
    ctxs = [conflux.Context(**kw) for _ in range(3)]
    try:
        tag = f"empty{int(no_inline)}"
        ids = [c.put(f"{tag}/in{i}", np.zeros(0, np.float32), no_inline=no_inline)
               for i, c in enumerate(ctxs)]
        for r, (caller, flags) in enumerate([(0, {}), (2, {}), (1, {"allreduce": True}),
                                             (0, {"op": "max"})]):
            used = ctxs[caller].reduce_objects(ids, f"{tag}/out{r}", dtype=np.float32, **flags)
            assert sorted(used) == [0, 1, 2]
            for c in ctxs:
                got = c.get(f"{tag}/out{r}", dtype=np.float32)
                assert got.dtype == np.float32 and got.shape == (0,)
        # two inputs of one node, reduced by another
        a = ctxs[0].put(f"{tag}/a", np.zeros(0, np.int64), no_inline=no_inline)
        b = ctxs[0].put(f"{tag}/b", np.zeros(0, np.int64), no_inline=no_inline)
        assert sorted(ctxs[1].reduce_objects([a, b], f"{tag}/ab", dtype=np.int64)) == [0, 1]
        assert ctxs[2].get(f"{tag}/ab", dtype=np.int64).shape == (0,)
    finally:
        for c in ctxs:
            c.close()


@pytest.mark.skipif(not have_torch(), reason="torch is not installed")
def test_torch_tensors(ctx):
    import torch
    t = torch.arange(1000, dtype=torch.bfloat16)
    ctx.put("tbf16", t)
    out = torch.zeros(1000, dtype=torch.bfloat16)
    ctx.get("tbf16", out=out)
    assert torch.equal(out, t)
    ctx.delete("tbf16")
    # a conjugated view is read as its values (its memory holds the others);
    # as an output it is refused (torch raised its own RuntimeError)
    z = torch.tensor([1 + 2j, 3 - 1j], dtype=torch.complex64)
    ctx.put("tconj", z.conj())
    got = torch.zeros(2, dtype=torch.complex64)
    ctx.get("tconj", out=got)
    assert torch.equal(got, z.conj().resolve_conj())
    with pytest.raises(ValueError, match="conjugated or negated"):
        ctx.get("tconj", out=torch.zeros(2, dtype=torch.complex64).conj())
    ctx.delete("tconj")


def test_reduce_local_bf16():
    ml = pytest.importorskip("ml_dtypes")
    a = np.array([1.5, 2.0, -3.0, 256.0], dtype=ml.bfloat16)
    b = np.array([0.5, 1.0, 1.0, 1.0], dtype=ml.bfloat16)
    want = (a.astype(np.float32) + b.astype(np.float32)).astype(ml.bfloat16)
    conflux.reduce_local(a, b)
    assert a.tobytes() == want.tobytes()


def test_close_while_a_call_waits(coord):
    """close() from another thread never frees the context under a running get."""
    c = conflux.Context(coord=coord.address, token=coord.token, timeout=10)
    errs = []
    started = threading.Event()

    def getter():
        started.set()
        try:
            c.get("nobody-puts-this", timeout=1.0)
        except conflux.Error as e:
            errs.append(e)

    t = threading.Thread(target=getter)
    t.start()
    started.wait(10)
    c.close()  # the get still runs; the context goes when it returns
    t.join(30)
    assert not t.is_alive()
    assert len(errs) == 1 and isinstance(errs[0], (conflux.TimeoutError, conflux.ClosedError))
    with pytest.raises(conflux.ClosedError):
        c.get("x", timeout=0.1)


def _two_ranks(c0, c1, name):
    """The two ranks of group ``name`` on contexts c0 and c1, joined on two threads."""
    gs = [None, None]

    def join(r, c):
        gs[r] = conflux.Group(c, name, rank=r, size=2)

    ths = [threading.Thread(target=join, args=(r, c)) for r, c in enumerate((c0, c1))]
    for t in ths:
        t.start()
    for t in ths:
        t.join(30)
    return gs


def _asleep(tid):
    """Whether thread ``tid`` of this process sleeps (state S in its stat)."""
    try:
        with open(f"/proc/self/task/{tid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] == "S"
    except OSError:
        return False


def test_group_closed_while_a_call_waits_for_its_turn(coord):
    """close() on a third thread while two calls hold and wait for the group: rank 0's
    recv holds it (rank 1 never sends), a send and the close() wait behind it.  Whichever
    of them gets its turn first, the send runs on the live group or raises ClosedError;
    it never runs on the group the close freed (the check is made in its turn, under the
    group's lock, not before it waited), and every call after the close raises."""
    kw = dict(coord=coord.address, token=coord.token, timeout=10, transports="tcp")
    with conflux.Context(**kw) as c0, conflux.Context(**kw) as c1:
        g0, g1 = _two_ranks(c0, c1, "close-turn")
        out = {}

        def call(name, fn):
            out[name + ".tid"] = threading.get_native_id()
            try:
                out[name] = fn()
            except conflux.Error as e:
                out[name] = e

        recv = threading.Thread(target=call, args=(
            "recv", lambda: g0.recv(np.zeros(4, np.int32), 1, tag=7, timeout=1.5)))
        recv.start()
        deadline = time.monotonic() + 10
        while not _asleep(out.get("recv.tid", 0)) and time.monotonic() < deadline:
            time.sleep(0.001)
        send = threading.Thread(target=call, args=(
            "send", lambda: g0.send(np.ones(4, np.int32), 1, tag=8)))
        send.start()
        while not _asleep(out.get("send.tid", 0)) and time.monotonic() < deadline:
            time.sleep(0.001)
        g0.close()  # waits behind the recv, in turn with the send
        for t in (recv, send):
            t.join(30)
            assert not t.is_alive()
        assert isinstance(out["recv"], conflux.TimeoutError), out["recv"]
        assert out["send"] is None or isinstance(out["send"], conflux.ClosedError), out["send"]
        with pytest.raises(conflux.ClosedError):
            g0.send(np.ones(4, np.int32), 1, tag=9)
        g1.close()


def test_get_nb_progress(coord, monkeypatch):
    """get_nb: progress() reports the bytes landed in order of the size.

    The holder is started with the test hook CFX_XFER_TEST_STALL=4 (its
    uploads stop after 4 chunks): the get reports exactly 4 chunks of 16,
    with those bytes in the buffer, until its deadline ends it.  A get of an
    object not put yet has no size; once put it completes with every byte.
    A collective's request has no byte count (UnsupportedError).
    """
    import time
    chunk, n = 64 << 10, 16
    kw = dict(coord=coord.address, token=coord.token, timeout=20, transports="tcp")
    monkeypatch.setenv("CFX_XFER_TEST_STALL", "4")
    holder = conflux.Context(**kw)
    monkeypatch.delenv("CFX_XFER_TEST_STALL")
    with holder, conflux.Context(**kw) as getter:
        src = np.random.default_rng(3).integers(0, 256, chunk * n, dtype=np.uint8)
        holder.put("progress/stalled", src, chunk_size=chunk, no_inline=True)
        out = np.zeros_like(src)
        req = getter.get_nb("progress/stalled", out, timeout=8)
        deadline = time.monotonic() + 7
        done, total = req.progress()
        while done < 4 * chunk and time.monotonic() < deadline:
            time.sleep(0.01)
            done, total = req.progress()
        assert (done, total) == (4 * chunk, n * chunk)
        assert np.array_equal(out[:done], src[:done]) and not out[done:].any()
        # the get's own words, whichever call reports it and how often
        for call in (req.wait, req.test, req.wait):
            with pytest.raises(conflux.TimeoutError) as ei:
                call()
            assert "with 4 of 16 chunks" in ei.value.detail, ei.value.detail
            assert f"from node {holder.node_id}" in ei.value.detail, ei.value.detail
        with pytest.raises(conflux.TimeoutError):
            req.progress()

        late = np.arange(2 * chunk, dtype=np.uint8)
        out2 = np.zeros_like(late)
        req = getter.get_nb("progress/late", out2, timeout=20)
        assert req.progress() == (0, None)
        holder.put("progress/late", late, chunk_size=chunk, no_inline=True)
        req.wait()
        assert req.progress() == (late.nbytes, late.nbytes)
        assert np.array_equal(out2, late)

        with conflux.Group(getter, "solo-progress", rank=0, size=1) as g:
            work = g.allreduce(np.ones(4, np.float32), async_op=True)
            with pytest.raises(conflux.UnsupportedError):
                work._req.progress()
            work.wait()


def _wait_in_threads(wait, n=2):
    """wait() from n threads at once; returns what each raised (None when it returned)."""
    errs = [None] * n
    go = threading.Barrier(n + 1)

    def waiter(i):
        go.wait()
        try:
            wait()
        except Exception as e:  # noqa: BLE001 - the test reports it
            errs[i] = e

    ths = [threading.Thread(target=waiter, args=(i,)) for i in range(n)]
    for t in ths:
        t.start()
    go.wait()
    return ths, errs


def test_request_waited_by_two_threads(coord):
    """Two threads waiting on one get_nb: the request completes once, both
    see it succeed, and the context still counts the group that holds it
    (a second completion let close() destroy it under the group)."""
    import time
    kw = dict(coord=coord.address, token=coord.token, timeout=20)
    for i in range(5):
        a, b = conflux.Context(**kw), conflux.Context(**kw)
        g = conflux.Group(b, f"two-waiters-{i}", rank=0, size=1)
        src = np.random.default_rng(i).integers(0, 256, 1 << 16, dtype=np.uint8)
        out = np.zeros_like(src)
        req = b.get_nb(f"two-waiters/{i}", out, timeout=20)
        ths, errs = _wait_in_threads(req.wait)
        time.sleep(0.05)  # let both block in the wait
        a.put(f"two-waiters/{i}", src)
        for t in ths:
            t.join(30)
        assert not any(t.is_alive() for t in ths)
        assert errs == [None, None], errs
        assert req.test() is True
        assert out.tobytes() == src.tobytes()
        b.close()  # the group still holds the context
        x = np.arange(8, dtype=np.float32)
        assert g.allreduce(x).tobytes() == np.arange(8, dtype=np.float32).tobytes()
        g.close()
        with pytest.raises(conflux.ClosedError):
            b.get("x", timeout=0.1)
        a.delete(f"two-waiters/{i}")
        a.close()


def test_work_waited_by_two_threads(coord):
    """Two threads waiting on one async allreduce between two ranks (two
    groups in two threads): both get the result, and the groups and
    contexts close cleanly after."""
    kw = dict(coord=coord.address, token=coord.token, timeout=20)
    with conflux.Context(**kw) as a, conflux.Context(**kw) as b:
        g0, g1 = _two_ranks(a, b, "two-waiters-work")
        n = 1 << 16
        for step in range(5):
            x0 = np.arange(n, dtype=np.float32) + step
            x1 = np.arange(n, dtype=np.float32) * 2
            want = (x0 + x1).tobytes()
            w = g0.allreduce(x0, async_op=True)
            waiters, errs = _wait_in_threads(w.wait)
            res1 = []
            other = threading.Thread(target=lambda: res1.append(g1.allreduce(x1)))
            other.start()
            for t in (*waiters, other):
                t.join(30)
            assert not any(t.is_alive() for t in (*waiters, other))
            assert errs == [None, None], errs
            assert w.is_completed() and w.wait() is x0
            assert x0.tobytes() == want and res1[0].tobytes() == want
        g0.close()
        g1.close()


def test_disagreement_with_a_rank_that_left_is_named(coord):
    """Rank 0 sends its part of an allreduce of another size and leaves the
    cluster; rank 1's call fails with CFX_ERR_INVALID naming the call and
    the disagreement (it used to say only "node N left the cluster": the
    text of its failed attempt to tell rank 0)."""
    kw = dict(coord=coord.address, token=coord.token, timeout=20)
    a, b = conflux.Context(**kw), conflux.Context(**kw)
    g0, g1 = _two_ranks(a, b, "left-disagreeing")
    with pytest.raises(conflux.TimeoutError):
        g0.allreduce(np.ones(1000, np.float32), timeout=0.5)  # its message is on its way
    g0.close()
    a.close()
    with pytest.raises(conflux.PeerFailedError):  # until rank 1 knows that rank 0 left
        g1.recv(np.zeros(1, np.float32), 0, tag=7, timeout=10)
    with pytest.raises(conflux.InvalidError) as ei:
        g1.allreduce(np.ones(4, np.float32), timeout=10)
    assert "allreduce #0" in ei.value.detail and "disagree" in ei.value.detail, ei.value.detail
    g1.close()
    b.close()

def test_collective_out_must_match(ctx):
    """out= of another dtype is a TypeError naming both (it was filled with
    the input's bits); of another size a ValueError; a matching one is filled."""
    try:
        import ml_dtypes  # scripts/test.sh installs it; pip install ./python does not
    except ImportError:
        ml_dtypes = None
    f32 = np.arange(4, dtype=np.float32)
    with conflux.Group(ctx, "out-checks", rank=0, size=1) as g:
        calls = {
            "allreduce": lambda o: g.allreduce(f32, out=o),
            "reduce": lambda o: g.reduce(f32, out=o),
            "allgather": lambda o: g.allgather(f32, out=o),
            "reduce_scatter": lambda o: g.reduce_scatter(f32, out=o),
            "alltoall": lambda o: g.alltoall(f32, out=o),
            "gather": lambda o: g.gather(f32, out=o),
        }
        for what, call in calls.items():
            with pytest.raises(TypeError) as ei:
                call(np.zeros(4, np.int32))
            assert f"{what}: out has dtype int32, the input float32" in str(ei.value)
            with pytest.raises(ValueError, match=f"{what}: out has 32 bytes, needs 16"):
                call(np.zeros(8, np.float32))
            out = np.zeros(4, np.float32)
            assert call(out) is out and out.tobytes() == f32.tobytes()
        with pytest.raises(TypeError, match="scatter: the root's tensor has dtype int32, out float32"):
            g.scatter(np.zeros(4, np.float32), np.arange(4, dtype=np.int32))
        out = np.zeros(4, np.float32)
        assert g.scatter(out, f32).tobytes() == f32.tobytes()
        with pytest.raises(TypeError, match="out has dtype >f4, the input float32"):
            g.allgather(f32, out=np.zeros(4, ">f4"))
        raw = bytearray(16)  # a plain buffer is bytes: any type moves into it
        assert g.allgather(f32, out=raw) is raw and bytes(raw) == f32.tobytes()
        if ml_dtypes is not None:
            bf = np.arange(4).astype(ml_dtypes.bfloat16)
            with pytest.raises(TypeError, match="out has dtype uint16, the input bfloat16"):
                g.allgather(bf, out=np.zeros(4, np.uint16))
            out = np.zeros(4, ml_dtypes.bfloat16)
            assert g.allreduce(bf, out=out).tobytes() == bf.tobytes()


def _gone(pid):
    """The process is gone (or a zombie nobody reaps: it runs no more)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except FileNotFoundError:
        return True


@pytest.mark.parametrize("how", ["exit", "os._exit"])
def test_coordinator_dies_with_its_parent(how):
    """A Coordinator never stopped does not outlive its process: at exit its
    finalizer stops it; without one (os._exit) the kernel's parent-death
    signal does (Linux)."""
    import subprocess
    import sys
    import time
    if how == "os._exit" and not sys.platform.startswith("linux"):
        pytest.skip("the parent-death signal is Linux's")
    end = "import os; os._exit(0)" if how == "os._exit" else ""
    code = ("import conflux, os\n"
            "c = conflux.Coordinator()\n"
            "print(c.proc.pid, c.log_path, flush=True)\n" + end)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    pid = int(p.stdout.split()[0])
    # the token file is gone once the coordinator is up: nothing secret
    # stays on disk however its owner ends (os._exit runs no finalizer)
    tokdir = os.path.dirname(p.stdout.split()[1])
    assert not os.path.exists(os.path.join(tokdir, "token"))
    deadline = time.monotonic() + 20
    while not _gone(pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _gone(pid), f"conflux-coord {pid} outlived its parent"


def test_unknown_algorithm(ctx):
    """algo= not an algorithm's name is a ValueError listing the names (a bare KeyError)."""
    with conflux.Group(ctx, "algo-names", rank=0, size=1) as g:
        with pytest.raises(ValueError) as ei:
            g.allreduce(np.ones(4, np.float32), algo="magic")
        assert str(ei.value) == ("unknown algorithm 'magic'; one of auto, ring, tree, chain, "
                                 "dbtree, rhd, direct, recdbl")
        x = np.ones(4, np.float32)
        assert g.allreduce(x, algo="ring").tobytes() == np.ones(4, np.float32).tobytes()


@pytest.mark.parametrize("arg,value,choices", [
    ("role", "boss", "worker, server"),
    ("consistency", "eventual", "bsp, ssp, asp"),
    ("optimizer", "rmsprop", "sum, sgd, momentum, adam"),
])
def test_parameter_server_unknown_choice(ctx, arg, value, choices):
    """A parameter-server option that is not one of its names is a ValueError listing them
    (it was a bare KeyError), raised before the job is joined."""
    with pytest.raises(ValueError) as ei:
        conflux.ParameterServer(ctx, "choices", **{arg: value})
    assert str(ei.value) == f"unknown {arg} {value!r}; one of {choices}"


def test_parameter_server_alone_says_who_it_waited_for(ctx):
    """cfx_ps_create's timeout names the member that did not come (the detail was lost)."""
    with pytest.raises(conflux.TimeoutError) as ei:
        conflux.ParameterServer(ctx, "alone", role="server", num_workers=1, timeout=0.3)
    assert "job alone: worker 0 did not join within 300 ms" in ei.value.detail


def test_group_rank_and_size_in_range(ctx):
    """rank and size out of 0 <= rank < size <= INT_MAX are a ValueError naming
    the argument (rank 2**32 was taken as rank 0, size 2**31+2 as negative)."""
    bad = [({"rank": 2**32, "size": 1}, "rank 4294967296 is out of range"),
           ({"rank": 2**64, "size": 1}, "rank 18446744073709551616 is out of range"),
           ({"rank": -1, "size": 1}, "rank -1 is out of range"),
           ({"rank": 0, "size": 2**31 + 2}, "size 2147483650 is out of range"),
           ({"rank": 0, "size": 0}, "size 0 is out of range"),
           ({"rank": 1, "size": 1}, r"rank 1 is out of range: 0 <= rank < size \(1\)")]
    for kw, msg in bad:
        with pytest.raises(ValueError, match=msg):
            conflux.Group(ctx, "range", **kw)
    with pytest.raises(TypeError):
        conflux.Group(ctx, "range", rank="0", size=1)
    # a bool is not a rank or a size (True was taken as 1)
    for kw in ({"rank": True, "size": 2}, {"rank": 0, "size": True},
               {"rank": np.bool_(False), "size": 1}):
        with pytest.raises(TypeError, match="must be an int"):
            conflux.Group(ctx, "range", timeout=0.1, **kw)
    with conflux.Group(ctx, "range", rank=0, size=1) as g:
        assert (g.rank, g.size) == (0, 1)


def test_rank_arguments_are_ints(ctx):
    """root= and peer= take a rank: True passed for rank 1 (a broadcast from
    rank 1 in a group of 2), a float or a string are a TypeError naming the
    argument; numpy integers are ranks."""
    with conflux.Group(ctx, "ranks", rank=0, size=1) as g:
        x = np.arange(4, dtype=np.float32)
        calls = (lambda r: g.broadcast(x, root=r), lambda r: g.reduce(x, root=r),
                 lambda r: g.gather(x, root=r), lambda r: g.scatter(x, x, root=r),
                 lambda r: g.send(x, r), lambda r: g.recv(x, r))
        for i, call in enumerate(calls):
            what = "peer" if i >= 4 else "root"
            for bad in (True, False, np.bool_(False), 0.0, "0", None):
                with pytest.raises(TypeError, match=f"^{what} must be a rank"):
                    call(bad)
        assert g.broadcast(x, root=np.int64(0)) is x
        assert np.array_equal(g.reduce(x, root=np.int32(0)), np.arange(4, dtype=np.float32))
        # beyond a C int: a ValueError naming the argument, not a bare OverflowError
        for i, call in enumerate(calls):
            what = "peer" if i >= 4 else "root"
            with pytest.raises(ValueError, match=f"^{what} {2**40} is out of range"):
                call(2**40)
        for call in (lambda t: g.send(x, 0, tag=t), lambda t: g.recv(x, 0, tag=t)):
            with pytest.raises(ValueError, match=r"^tag -1099511627776 is out of range"):
                call(-(2**40))
            with pytest.raises(TypeError, match="^tag must be an int"):
                call(True)


def test_op_is_not_a_bool(ctx):
    """op= takes a name or its code: True was taken as code 1 ("prod") and
    False as "sum"; a bool is a TypeError, in every call that reduces."""
    with conflux.Group(ctx, "ops", rank=0, size=1) as g:
        x = np.arange(1, 5, dtype=np.float32)
        calls = (lambda op: g.allreduce(x.copy(), op),
                 lambda op: g.reduce(x.copy(), 0, op),
                 lambda op: g.reduce_scatter(x.copy(), op),
                 lambda op: conflux.reduce_local(x.copy(), x, op))
        for call in calls:
            for bad in (True, False, np.bool_(True)):
                with pytest.raises(TypeError, match=r"^op must be one of \['max', 'min', 'prod', "
                                                    r"'sum'\] \(or its code 0-3\), not "):
                    call(bad)
        with pytest.raises(TypeError, match="^op must be one of"):
            ctx.reduce_objects(["a"], "b", dtype=np.float32, op=True, timeout=1)
        # names and codes as before
        assert np.array_equal(g.allreduce(x.copy(), "prod"), x)
        assert np.array_equal(g.allreduce(x.copy(), 1), x)
        y = x.copy()
        conflux.reduce_local(y, x, 1)
        assert np.array_equal(y, x * x)


_LAUNCHER_VARS = ("CFX_RANK", "CFX_WORLD_SIZE", "RANK", "WORLD_SIZE", "OMPI_COMM_WORLD_RANK",
                  "OMPI_COMM_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "PMI_RANK",
                  "PMI_SIZE")


def test_group_half_of_rank_and_size(ctx, monkeypatch):
    """Only one of rank and size, no launcher: the error says which is missing
    (it said "no rank and size given" when the rank was given)."""
    for v in _LAUNCHER_VARS:
        monkeypatch.delenv(v, raising=False)
    for kw, missing in (({"rank": 0}, "a rank but no size given"),
                        ({"size": 1}, "a size but no rank given"),
                        ({}, "no rank and size given")):
        with pytest.raises(conflux.InvalidError) as ei:
            conflux.Group(ctx, "half", **kw)
        assert ei.value.status == -1 and ei.value.detail.startswith(f"group: {missing} "), \
            ei.value.detail


def test_timeout_arguments(ctx):
    """A timeout is seconds: a bool or a str is a TypeError, one over the C
    layer's INT_MAX ms a ValueError in seconds; the raw timeout_ms alike in ms."""
    for bad in (True, False, "5", b"5", [1]):
        with pytest.raises(TypeError, match="timeout is a number of seconds"):
            ctx.get("never-put", timeout=bad)
    for bad in (2**31 / 1000, 1e12, 2**80):
        with pytest.raises(ValueError) as ei:
            ctx.get("never-put", timeout=bad)
        assert str(ei.value) == f"timeout must be between 0 and 2147483.647 s, not {bad!r}"
    for bad in (-1, -0.001, float("inf"), float("nan")):
        with pytest.raises(ValueError, match="timeout is in seconds and must be finite and >= 0"):
            ctx.get("never-put", timeout=bad)
    with pytest.raises(conflux.TimeoutError):
        ctx.get("never-put", timeout=np.float32(0.05))
    with pytest.raises(conflux.TimeoutError):
        ctx.get("never-put", timeout=0)
    req = ctx.get_nb("never-put", np.zeros(4, np.uint8), timeout=0.5)
    for bad in (True, "5", 1.5):
        with pytest.raises(TypeError, match="timeout_ms is a number of milliseconds"):
            req.wait(timeout_ms=bad)
    for bad in (2**31, 2**70, -1):
        with pytest.raises(ValueError, match="timeout_ms must be between 0 and 2147483647 "
                                             r"milliseconds \(2147483.647 s\)"):
            req.wait(timeout_ms=bad)
    with pytest.raises(conflux.TimeoutError):
        req.wait(timeout_ms=np.int64(20000))


def test_get_nb_dropped_unfinished_is_canceled(ctx):
    """A get_nb request dropped while it still waits for a holder is
    canceled (cfx_request_free withdraws it), not waited out to its
    deadline; the buffer is the caller's again and nothing lands in it."""
    import gc
    import time
    out = np.zeros(16, np.uint8)
    req = ctx.get_nb("dropped-get", out, timeout=600)
    assert req.test() is False
    t0 = time.monotonic()
    del req
    gc.collect()
    waited = time.monotonic() - t0
    assert waited < 300, f"the drop waited {waited:.1f} s: the get's deadline, not a cancel"
    ctx.put("dropped-get", np.full(16, 7, np.uint8))
    assert not out.any(), "the canceled get wrote into the buffer"
    # the buffer is no longer exported: it may be resized
    out.resize(32, refcheck=False)
    assert ctx.get("dropped-get").tobytes() == bytes([7] * 16)


@pytest.mark.parametrize("mode", ["integrity", "encrypt"])
def test_sealed_coordinator_and_data_plane(mode):
    """CFX_SECURE from Python: a sealed coordinator, two sealed contexts moving
    an array over tcp byte for byte; a context of another mode is refused."""
    with conflux.Coordinator(secure=mode) as coord:
        kw = dict(coord=coord.address, token=coord.token, timeout=20, transports="tcp")
        with conflux.Context(secure=mode, **kw) as a, conflux.Context(secure=mode, **kw) as b:
            assert f"secure = {mode}" in a.config()
            arr = np.arange(1 << 18, dtype=np.float32)  # 1 MiB: over the data plane
            oid = conflux.ObjectId.from_name(f"sealed/{mode}")
            a.put(oid, arr)
            got = b.get(oid, dtype=np.float32)
            assert np.array_equal(got, arr)
        with pytest.raises(conflux.AuthError) as ei:
            conflux.Context(secure="off", **kw)
        assert f"CFX_SECURE={mode}, this client with off" in str(ei.value)



def test_arrays_of_python_objects_are_refused(ctx):
    # their bytes are pointers: moved, they crashed the reader (another
    # process) or freed objects under this one (uncounted references)
    objs = np.array(["hello", {"a": 1}], dtype=object)
    with pytest.raises(TypeError, match="Python objects"):
        ctx.put("objarr", objs)
    ctx.put("objarr/bytes", np.arange(2, dtype=np.int64))
    with pytest.raises(TypeError, match="Python objects"):
        ctx.get("objarr/bytes", out=np.empty(2, dtype=object))
    # asked of a new array: refused before the fetch, in the same words
    # (it was numpy's "Cannot change data-type for array of references")
    with pytest.raises(TypeError, match="Python objects"):
        ctx.get("objarr/bytes", dtype=object)
    with conflux.Group(ctx, name="objarr", rank=0, size=1) as g:
        with pytest.raises(TypeError, match="Python objects"):
            g.allgather(objs)


def test_reduce_objects_needs_a_dtype(ctx):
    # np.dtype(None) is float64: float32 inputs were summed as float64 garbage
    with pytest.raises(ValueError, match="dtype is required"):
        ctx.reduce_objects(["a", "b"], "r", dtype=None)
    # a dtype the library does not reduce is a TypeError, as for an array of it
    with pytest.raises(TypeError, match="is not one the library reduces"):
        ctx.reduce_objects(["a", "b"], "r", dtype=np.int8)


def test_forked_child_leaves_the_parents_context_alone(coord):
    # a child that ends normally runs its copies' finalizers: the context's
    # destroy left the cluster on the parent's connection (the parent's next
    # put failed, its objects were gone) and the Coordinator's removed the
    # parent's coordinator directory
    script = textwrap.dedent(f"""
        import os, sys
        import numpy as np
        import conflux
        kw = dict(coord={coord.address!r}, token={coord.token!r}, timeout=10)
        own = conflux.Coordinator()
        a, b = conflux.Context(**kw), conflux.Context(**kw)
        a.put("fork/before", np.arange(1000.0))
        pid = os.fork()
        if pid == 0:
            try:
                a.put("fork/child", np.ones(3))
            except conflux.InvalidError as e:
                sys.exit(0 if "forked" in str(e) else 3)
            sys.exit(4)
        _, st = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(st) == 0, st
        a.put("fork/after", np.arange(7.0))
        assert np.array_equal(b.get("fork/before", dtype=np.float64), np.arange(1000.0))
        assert np.array_equal(b.get("fork/after", dtype=np.float64), np.arange(7.0))
        assert "listening" in own.log()
        print("fork ok")
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                       timeout=120)
    assert p.returncode == 0 and "fork ok" in p.stdout, p.stdout[-3000:] + p.stderr[-3000:]


def test_ray_shutdown_then_start_begins_a_new_job():
    # conflux.ray's driver side without Ray itself: shutdown() used to stop the
    # coordinator but keep this process's Context and groups, so the job of the
    # next start() was refused ("already joined another Conflux job") and a
    # call without job= waited out its deadline on the stopped coordinator
    import conflux.ray as cr
    job = cr.start(bind="127.0.0.1", timeout=10)
    try:
        ref = cr.put(np.arange(5.0), job=job)
        assert np.array_equal(cr.get(ref, job=job), np.arange(5.0))
        cr.init_collective_group(1, 0, group_name="restart", job=job)
        cr.shutdown()
        assert not cr.is_group_initialized("restart")
        job2 = cr.start(bind="127.0.0.1", timeout=10)
        assert job2 != job
        ref2 = cr.put(np.arange(3.0), job=job2)
        assert np.array_equal(cr.get(ref2), np.arange(3.0))
        cr.init_collective_group(1, 0, group_name="restart", job=job2)
        assert np.array_equal(cr.allreduce(np.ones(4), "restart"), np.ones(4))
    finally:
        cr.shutdown()


def test_ray_job_joined_from_the_environment_then_named(monkeypatch):
    # an actor started with runtime_env=cr.runtime_env(job) joins from
    # CFX_COORD / CFX_TOKEN; a group it is declared in, or any call given
    # job=, then names the same job, which was refused ("this process
    # already joined another Conflux job")
    import conflux.ray as cr
    job = cr.start(bind="127.0.0.1", timeout=10)
    try:
        for k, v in cr.runtime_env(job)["env_vars"].items():
            monkeypatch.setenv(k, v)
        ref = cr.put(np.arange(4.0))
        assert np.array_equal(cr.get(ref, job=job), np.arange(4.0))
        cr.init_collective_group(1, 0, group_name="env-then-job", job=job)
        assert np.array_equal(cr.allreduce(np.ones(2), "env-then-job"), np.ones(2))
    finally:
        cr.shutdown()


def test_coordinator_timeout_is_checked_first():
    """Coordinator(timeout=) is seconds, checked before the coordinator starts:
    NaN was a deadline that never passed, -1 started it only to stop it and
    raise TimeoutError."""
    for bad in (-1, float("nan"), float("inf")):
        with pytest.raises(ValueError, match="timeout is in seconds and must be finite"):
            conflux.Coordinator(timeout=bad)
    for bad in (True, "5"):
        with pytest.raises(TypeError, match="timeout is a number of seconds"):
            conflux.Coordinator(timeout=bad)


def test_get_dtype_and_shape_are_not_for_out(ctx):
    """dtype= and shape= shape the array get() makes; with out= they were
    silently ignored (the float32 asked for came back as out's int64)."""
    ctx.put("get-out-dtype", np.arange(4, dtype=np.int64))
    for kw in ({"dtype": np.float32}, {"shape": (2, 2)}):
        with pytest.raises(TypeError, match="dtype and shape describe the array get"):
            ctx.get("get-out-dtype", np.zeros(4, np.int64), **kw)
    out = np.zeros(4, np.int64)
    assert ctx.get("get-out-dtype", out) is out and out.tolist() == [0, 1, 2, 3]
    assert ctx.get("get-out-dtype", dtype=np.int64, shape=(2, 2)).tolist() == [[0, 1], [2, 3]]
