"""A plain torch.distributed DDP script (what torchrun would start), run unchanged by
runtime.spmd.SPMDActor in tests/test_spmd.py: gloo on CPU, NCCL when CUDA is there."""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.optim as optim
from torch.nn.parallel import DistributedDataParallel as DDP


def main() -> None:
    out_dir = sys.argv[1]
    cuda = torch.cuda.is_available()
    dist.init_process_group("nccl" if cuda else "gloo")
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    if cuda:
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
    torch.manual_seed(0)
    model = nn.Linear(10, 1).to(device)
    ddp_model = DDP(model)
    optimizer = optim.SGD(ddp_model.parameters(), lr=0.01)
    torch.manual_seed(100 + rank)  # different data per rank: DDP must average the gradients
    for step in range(5):
        loss = ddp_model(torch.randn(4, 10, device=device)).sum()
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        print(f"[Rank {rank}] Step {step} loss={loss.item()}")
    keys = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
            "MASTER_PORT", "GROUP_RANK")
    with open(os.path.join(out_dir, f"rank{rank}.json"), "w") as f:
        json.dump({"env": {k: os.environ[k] for k in keys}, "argv": sys.argv,
                   "weight": model.weight.detach().cpu().flatten().tolist(),
                   "world": dist.get_world_size()}, f)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
