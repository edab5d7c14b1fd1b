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
