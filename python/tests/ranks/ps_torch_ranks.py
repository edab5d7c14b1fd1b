"""Torch training through the parameter server: rank 0 serves (SGD on the
server, mean gradient), the others train with ParameterServerOptimizer.
Checked against the same full-batch SGD computed locally by every worker."""
import os
import sys

import numpy as np
import torch

import conflux
from conflux.torch import ParameterServerOptimizer

rank, size = int(os.environ["CFX_RANK"]), int(os.environ["CFX_WORLD_SIZE"])
W = size - 1
LR = 0.1


def make_net():
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))


def batch(w, step):
    g = torch.Generator().manual_seed(100 * w + step)
    x = torch.randn(32, 8, generator=g)
    return x, x.sum(1, keepdim=True).sin()


with conflux.Context(timeout=60) as ctx:
    ps = conflux.ParameterServer(ctx, "torch-ps", role="server" if rank == 0 else "worker",
                                 index=max(rank - 1, 0), num_workers=W, num_servers=1,
                                 optimizer="sgd", lr=LR, grad_scale=1.0 / W, timeout=60)
    if rank == 0:
        ps.serve(timeout=180)
    else:
        net = make_net()
        opt = ParameterServerOptimizer(net.parameters(), ps)
        ref = make_net()  # the reference: mean gradient over all workers' batches
        for step in range(5):
            x, y = batch(rank - 1, step)
            opt.zero_grad()
            torch.nn.functional.mse_loss(net(x), y).backward()
            opt.step()
            grads = [torch.zeros_like(p) for p in ref.parameters()]
            for w in range(W):
                ref.zero_grad()
                xw, yw = batch(w, step)
                torch.nn.functional.mse_loss(ref(xw), yw).backward()
                for acc, p in zip(grads, ref.parameters()):
                    acc += p.grad
            with torch.no_grad():
                for p, acc in zip(ref.parameters(), grads):
                    p -= LR * (acc * (1.0 / W))
        for p, q in zip(net.parameters(), ref.parameters()):
            if not np.allclose(p.detach().numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6):
                print(f"rank {rank}: parameters differ from the local SGD reference",
                      file=sys.stderr)
                sys.exit(1)
    ps.close()
print(f"rank {rank}: ok")
