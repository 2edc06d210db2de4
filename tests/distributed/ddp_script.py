"""A small DDP training script, correct unless `--bug NAME` swaps in one classic mistake.

Run by test_simulated_ddp.py under `torchdoctor run --simulate cuda:N -- torchrun ...`
(and, with `--backend gloo`, as the plain CPU run to compare the losses with). Every
buggy line carries a `# bug: NAME` marker; the tests expect the report at that line.
"""

from __future__ import annotations

import argparse
import os
import sys

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--bug", default="")
    parser.add_argument("--backend", default="nccl")
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    bug = args.bug
    local_rank = int(os.environ["LOCAL_RANK"])
    gpu = args.backend == "nccl"

    if gpu and bug != "no-set-device":
        torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank) if gpu else torch.device("cpu")
    dist.init_process_group(args.backend)
    rank = dist.get_rank()
    checkpoint = os.path.join(args.out, "model.pt")

    torch.manual_seed(0)  # the same data and initial weights on every rank
    dataset = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    if bug == "no-sampler":
        loader = DataLoader(dataset, batch_size=4)
    else:
        loader = DataLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset, seed=0))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1))
    model = model.to("cuda:0" if bug == "model-on-cuda0" else device)  # bug: model-on-cuda0
    if bug == "load-to-cuda0":
        if rank == 0:
            torch.save(model.state_dict(), checkpoint)
        dist.barrier()
        model.load_state_dict(torch.load(checkpoint))  # bug: load-to-cuda0
    ddp = DDP(model, device_ids=[local_rank] if gpu else None)  # bug: no-set-device, at-ddp
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)

    for x, y in loader:  # bug: no-sampler
        x, y = x.to(device), y.to(device)
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total = loss.detach().clone()
        if bug == "cpu-collective":
            total = torch.tensor([loss.item()])
            dist.all_reduce(total)  # bug: cpu-collective
        else:
            dist.all_reduce(total)
        # one write per line: the ranks share one stdout pipe
        sys.stdout.write(f"rank {rank} loss {total.item() / dist.get_world_size():.6f}\n")
        sys.stdout.flush()

    if bug == "every-rank-saves":
        torch.save(ddp.module.state_dict(), checkpoint)  # bug: every-rank-saves
    elif bug == "wrapped-state-dict" and rank == 0:
        torch.save(ddp.state_dict(), checkpoint)  # bug: wrapped-state-dict
    elif rank == 0:
        torch.save(ddp.module.state_dict(), checkpoint)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
