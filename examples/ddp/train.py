"""A small DDP training script with one classic multi-GPU mistake: every rank loads the
checkpoint with a bare `torch.load`, so all of them put it on cuda:0.

    torchdoctor run --simulate cuda:4 -- torchrun --standalone --nproc-per-node 4 train.py
"""

import os
import sys
import tempfile

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset


def main() -> None:
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device("cuda", local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()

    torch.manual_seed(0)  # the same data and initial weights on every rank
    dataset = TensorDataset(torch.randn(32, 8), torch.randn(32, 1))
    loader = DataLoader(dataset, batch_size=4, sampler=DistributedSampler(dataset, seed=0))
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)

    folder = [tempfile.mkdtemp(prefix="ddp-example-") if rank == 0 else ""]
    dist.broadcast_object_list(folder)  # one folder for every rank
    checkpoint = os.path.join(folder[0], "model.pt")
    if rank == 0:
        torch.save(model.state_dict(), checkpoint)
    dist.barrier()
    model.load_state_dict(torch.load(checkpoint))  # every rank loads onto cuda:0
    dist.barrier()
    if rank == 0:
        os.remove(checkpoint)
        os.rmdir(folder[0])

    ddp = DDP(model, device_ids=[local_rank])
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    for x, y in loader:
        x, y = x.to(device), y.to(device)
        loss = nn.functional.mse_loss(ddp(x), y)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total = loss.detach().clone()
        dist.all_reduce(total)
        sys.stdout.write(f"rank {rank} loss {total.item() / dist.get_world_size():.6f}\n")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
