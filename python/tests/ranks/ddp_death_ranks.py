"""DDP with the Conflux hook: a rank that dies mid-training fails the others' backward().

The error reaches backward() as a RuntimeError naming the conflux error
(its class and status), not "Unable to cast CFX_ERR_... to Tensor".
"""
import os
import sys

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

import conflux
import conflux.torch as cft

rank, world = int(os.environ["CFX_RANK"]), int(os.environ["CFX_WORLD_SIZE"])
dist.init_process_group("gloo", init_method=f"file://{sys.argv[1]}", rank=rank,
                        world_size=world)
ctx = conflux.Context(timeout=30)
group = conflux.Group(ctx, "ddp-death")
torch.manual_seed(0)
model = DDP(torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)))
state = cft.AllreduceHookState(group)
model.register_comm_hook(state, cft.allreduce_hook)
opt = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(10):
    if rank == world - 1 and step == 2:
        print(f"rank {rank}: ok", flush=True)
        os._exit(0)  # dies without leaving the group
    x, y = torch.randn(8, 16), torch.randint(0, 4, (8,))
    loss = torch.nn.functional.cross_entropy(model(x), y)
    opt.zero_grad()
    try:
        loss.backward()
    except RuntimeError as e:
        msg = str(e)
        assert "PeerFailedError" in msg and "CFX_ERR_PEER_FAILED" in msg, msg
        assert step == 2 and "Unable to cast" not in msg, (step, msg)
        break
    opt.step()
else:
    sys.exit(f"rank {rank}: trained on after rank {world - 1} died")
state.close()
print(f"rank {rank}: ok", flush=True)
os._exit(0)  # the process group and the group have a dead member: no orderly teardown
