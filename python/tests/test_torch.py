"""PyTorch: DDP with the Conflux allreduce hook against the same training with Gloo,
and training through the parameter server.  Skipped when torch is not installed."""
import sys
from pathlib import Path

import numpy as np
import pytest

import conflux
from conftest import RANKS, have_torch, run_ranks

pytestmark = pytest.mark.skipif(not have_torch(), reason="torch is not installed")
EXAMPLES = Path(__file__).resolve().parents[1] / "examples"


def _ddp(tmp_path, backend, n, *extra):
    out = tmp_path / backend
    cmd = [sys.executable, str(EXAMPLES / "ddp_train.py"), "--backend", backend,
           "--store", str(tmp_path / f"{backend}.store"), "--out", str(out), *extra]
    p = conflux.cfx_run(n, cmd, timeout=240)
    assert p.returncode == 0, p.stdout[-4000:] + p.stderr[-4000:]
    return [np.load(f"{out}.rank{r}.npz") for r in range(n)]


N = 3  # ranks of the DDP runs: three, so the sums' order may differ from Gloo's


@pytest.fixture(scope="module")
def gloo(tmp_path_factory):
    """The reference: the same training with DDP's own allreduce over Gloo."""
    return _ddp(tmp_path_factory.mktemp("gloo"), "gloo", N)


def test_ddp_hook_matches_gloo(tmp_path, gloo):
    n = N
    cfx = _ddp(tmp_path, "conflux", n)
    for r in range(n):
        # the same loss within float rounding: the sums' order may differ
        np.testing.assert_allclose(cfx[r]["losses"], gloo[r]["losses"], rtol=1e-5, atol=1e-7)
        for k in cfx[r].files:
            if k.startswith("p"):
                np.testing.assert_allclose(cfx[r][k], gloo[r][k], rtol=1e-4, atol=1e-6)
        # every rank ends with the same parameters, bit for bit (one allreduce result)
        for k in cfx[r].files:
            if k.startswith("p"):
                assert np.array_equal(cfx[r][k], cfx[0][k])
    assert cfx[0]["losses"][-1] < cfx[0]["losses"][0]  # it trained


def test_ddp_hook_bf16_compression(tmp_path, gloo):
    cfx = _ddp(tmp_path, "conflux", N, "--compress", "bf16")
    # bf16 gradients: close to the float32 run, not equal
    for r in range(N):
        np.testing.assert_allclose(cfx[r]["losses"], gloo[r]["losses"], rtol=2e-2)
        for k in cfx[r].files:
            if k.startswith("p"):
                assert np.array_equal(cfx[r][k], cfx[0][k])


def test_ddp_example_runs_again_with_the_same_store(tmp_path):
    """The example removes its FileStore file at its end, so the same command
    runs again (the file was left behind, and a second run with it waited
    torch's 30 minutes); a file left by a run that did not end cleanly is
    refused at once, with what to do."""
    store = tmp_path / "ddp.store"
    cmd = [sys.executable, str(EXAMPLES / "ddp_train.py"), "--backend", "conflux", "--store",
           str(store), "--out", str(tmp_path / "c"), "--steps", "2"]
    for run in range(2):
        p = conflux.cfx_run(2, cmd, timeout=120)
        assert p.returncode == 0, (run, p.stdout[-4000:] + p.stderr[-4000:])
        assert not store.exists(), run
    store.write_text("left by a run that died")
    p = conflux.cfx_run(2, cmd, timeout=120)
    assert p.returncode != 0
    # each rank says so; cfx_run may end the others before they do, once the first exited
    assert f": --store {store} exists and is not empty: left by a run that did not end " \
           "cleanly, it would make this one wait; remove it or pass another path" in p.stderr, \
        p.stderr[-4000:]
    assert store.read_text() == "left by a run that died"


def test_parameter_server_optimizer():
    run_ranks(3, "ps_torch_ranks.py", timeout=240)


def test_group_torch_dtypes_in_process(coord):
    """One rank is a group too: dtype mapping of every torch dtype, bf16 included."""
    import torch
    with conflux.Context(coord=coord.address, token=coord.token, timeout=20) as ctx:
        with conflux.Group(ctx, "solo", rank=0, size=1) as g:
            for dt in (torch.float32, torch.float64, torch.float16, torch.bfloat16,
                       torch.int32, torch.int64, torch.uint8):
                t = torch.arange(100).to(dt)
                out = torch.zeros_like(t)
                g.allreduce(t, out=out)
                assert torch.equal(out, t)
                ag = g.allgather(t)
                assert ag.shape == (1, 100) and ag.dtype == dt and torch.equal(ag[0], t)
            with pytest.raises(ValueError):
                g.allreduce(torch.zeros(4, 4).t())  # not contiguous
            with pytest.raises(TypeError):
                g.allreduce(torch.zeros(4, dtype=torch.int16))  # not reducible


def test_hook_state_checks_its_arguments(coord):
    """AllreduceHookState refuses what is not a group, or a timeout that is not
    a number of seconds >= 0, when it is made: they were taken and failed
    only inside backward(), as a RuntimeError naming another error."""
    import torch
    import conflux.torch as cft
    for bad in (None, "ddp", object()):
        with pytest.raises(TypeError, match="^AllreduceHookState: group must be a conflux.Group, "
                                            f"not {type(bad).__name__} "):
            cft.AllreduceHookState(bad)
    with conflux.Context(coord=coord.address, token=coord.token, timeout=20) as ctx:
        with conflux.Group(ctx, "solo-hook", rank=0, size=1) as g:
            for bad in (-1, -0.5, float("nan"), float("inf"), 2.0**31):
                with pytest.raises(ValueError, match="^timeout "):
                    cft.AllreduceHookState(g, timeout=bad)
            for bad in (True, "5"):
                with pytest.raises(TypeError, match="^timeout is a number of seconds"):
                    cft.AllreduceHookState(g, timeout=bad)
            for t in (None, 0, 2.5):
                st = cft.AllreduceHookState(g, timeout=t, compress=torch.bfloat16)
                assert st.timeout == t and st.group is g
                st.close()


def _bits(t):
    import torch
    return t.contiguous().view(torch.uint8) if t.element_size() == 1 else \
        t.contiguous().view(-1).view(torch.uint8)


def test_data_movement_keeps_any_torch_dtype(coord):
    """The collectives that move bytes take every torch dtype and return the
    input's dtype and shape: ones numpy has but the library does not reduce
    (complex, uint16, uint32, int8, bool) and ones numpy lacks (float8, seen as
    their bits).  The outputs used to be allocated element-size times too
    large ("out has 384 bytes, needs 48")."""
    import torch
    kinds = [torch.complex64, torch.complex128, torch.uint16, torch.uint32, torch.int8,
             torch.int16, torch.bool, torch.float8_e4m3fn]
    with conflux.Context(coord=coord.address, token=coord.token, timeout=20) as ctx:
        with conflux.Group(ctx, "solo-move", rank=0, size=1) as g:
            for dt in kinds:
                base = torch.arange(6, dtype=torch.float32).reshape(2, 3)
                t = (base + 1j * base).to(dt) if dt.is_complex else base.to(dt)
                for name, out in (("allgather", g.allgather(t)), ("gather", g.gather(t)),
                                  ("alltoall", g.alltoall(t))):
                    want = (1, 2, 3) if name != "alltoall" else (2, 3)
                    assert out.dtype == dt and tuple(out.shape) == want, (name, dt, out.shape)
                    assert torch.equal(_bits(out.reshape(2, 3)), _bits(t)), (name, dt)
                b = t.clone()
                g.broadcast(b, root=0)
                assert torch.equal(_bits(b), _bits(t)), ("broadcast", dt)


def test_get_as_any_torch_dtype(ctx):
    """A get's dtype may be any torch dtype (a get moves bytes): int8, int16
    and bool were refused as "not one the library reduces"."""
    import torch
    raw = np.arange(64, dtype=np.uint8)
    ctx.put("typed-bytes", raw)
    for dt, npdt, shape in ((torch.int8, np.int8, (64,)), (torch.int16, np.int16, (4, 8)),
                            (torch.bool, np.bool_, (64,)), (torch.complex64, np.complex64, (8,)),
                            (torch.float8_e4m3fn, np.uint8, (64,))):
        a = ctx.get("typed-bytes", dtype=dt, shape=shape)
        assert a.dtype == np.dtype(npdt) and a.shape == shape, (dt, a.dtype, a.shape)
        assert a.tobytes() == raw.tobytes()
    with pytest.raises(ValueError):
        ctx.get("typed-bytes", dtype=object(), timeout=1)
    ctx.delete("typed-bytes")


def test_ddp_hook_peer_death(tmp_path):
    """A rank dies mid-training: the others' backward() raises the conflux error."""
    run_ranks(N, "ddp_death_ranks.py", str(tmp_path / "store"))
