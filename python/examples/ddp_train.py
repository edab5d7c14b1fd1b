"""Train a small MLP with PyTorch DDP, gradients allreduced by Conflux or by Gloo.

Run as ranks of cfx_run (rank and size from CFX_RANK / CFX_WORLD_SIZE);
``python -m conflux`` is the cfx_run of the installed package:

    python -m conflux -n 2 python ddp_train.py --backend conflux --store /tmp/s1 --out /tmp/c
    python -m conflux -n 2 python ddp_train.py --backend gloo    --store /tmp/s2 --out /tmp/g

Both runs start from the same weights and see the same data, so their losses
agree to float rounding.  Each rank writes its losses and final parameters
to OUT.rank<R>.npz.

STORE is the file of torch.distributed's FileStore: the run removes it at
its end, so the same command runs again.  One left by a run that did not
end cleanly (a rank died, Ctrl-C) is refused at the start, before any rank
uses it: torch would wait 30 minutes on its stale contents.
"""
import argparse
import datetime
import os
import sys

import numpy as np
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import conflux
import conflux.torch as cft


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--backend", choices=["conflux", "gloo"], required=True)
    ap.add_argument("--store", required=True, help="file for torch.distributed's FileStore")
    ap.add_argument("--out", required=True)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--compress", choices=["none", "bf16", "fp16"], default="none")
    a = ap.parse_args()
    rank, world = int(os.environ["CFX_RANK"]), int(os.environ["CFX_WORLD_SIZE"])
    # Every rank looks at the store before any uses it: a Group's creation
    # waits for all the ranks, and init_process_group() comes after it.
    if os.path.exists(a.store) and os.path.getsize(a.store) > 0:
        sys.exit(f"rank {rank}: --store {a.store} exists and is not empty: left by a run that "
                 "did not end cleanly, it would make this one wait; remove it or pass another "
                 "path")
    ctx = conflux.Context(timeout=60)
    group = conflux.Group(ctx, "ddp", timeout=60)

    torch.manual_seed(0)  # the same initial weights on every rank and in both runs
    torch.set_num_threads(1)
    net = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64),
                              torch.nn.Tanh(), torch.nn.Linear(64, 4))
    # DDP needs a process group for its start (parameter broadcast); with the
    # hook, every gradient bucket goes through Conflux instead of Gloo.
    dist.init_process_group("gloo", init_method=f"file://{a.store}", rank=rank,
                            world_size=world, timeout=datetime.timedelta(seconds=60))
    # small buckets: several per step, overlapping the backward pass
    model = DDP(net, bucket_cap_mb=0.01)
    state = None
    if a.backend == "conflux":
        comp = {"none": None, "bf16": torch.bfloat16, "fp16": torch.float16}[a.compress]
        state = cft.AllreduceHookState(group, compress=comp)
        model.register_comm_hook(state, cft.allreduce_hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)

    g = torch.Generator().manual_seed(1234 + rank)  # this rank's shard of the data
    w_true = torch.randn(32, 4, generator=torch.Generator().manual_seed(7))
    losses = []
    for _ in range(a.steps):
        x = torch.randn(64, 32, generator=g)
        y = torch.tanh(x @ w_true) + 0.01 * torch.randn(64, 4, generator=g)
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.item())
    params = {f"p{i}": p.detach().numpy().copy() for i, p in enumerate(model.parameters())}
    np.savez(f"{a.out}.rank{rank}.npz", losses=np.array(losses), **params)
    if state is not None:
        print(f"rank {rank}: {state.buckets} buckets allreduced by conflux")
        state.close()
    # every rank done with gloo before any tears it down: a rank whose
    # group went while a peer's gloo threads still talked to it aborted at
    # exit now and then ("terminate called without an active exception")
    dist.barrier()
    dist.destroy_process_group()
    # Every rank is past its last use of the store: rank 0 removes it (the
    # FileStore would, in the destructor that os._exit() below skips).
    group.barrier()
    if rank == 0:
        try:
            os.remove(a.store)
        except FileNotFoundError:  # a torch whose FileStore removed it at destroy
            pass
    group.close()
    ctx.close()
    print(f"rank {rank}: loss {losses[0]:.5f} -> {losses[-1]:.5f}")
    print(f"rank {rank}: ok", flush=True)
    # Leave without finalizing the interpreter.  DDP keeps Gloo's group (and
    # its worker threads) alive past destroy_process_group(), and a worker
    # drops its last reference to a finished work item (here the barrier's)
    # on its own time; one that does so after finalizing began aborts the
    # process ("terminate called without an active exception", from
    # ProcessGroupGloo::runLoop taking the GIL), about one run in 40 on two
    # busy cores.  Everything of Conflux's is closed above.
    sys.stderr.flush()
    os._exit(0)


if __name__ == "__main__":
    main()
