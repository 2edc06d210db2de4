"""A tiny DDP training step run by test_ddp.py under `torchrun --nproc_per_node=2`.

Uses torchdoctor's helpers end to end: pick_device, to_device, DeviceLoader,
device_of, save_checkpoint (rank 0) and load_checkpoint (every rank).
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

import torchdoctor as td


def main(out_dir: Path) -> None:
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    device = td.pick_device()  # LOCAL_RANK is set, no GPU: cpu

    torch.manual_seed(0)  # the same initial weights and data on every rank
    model = td.to_device(nn.Linear(4, 2), device)
    ddp = DistributedDataParallel(model)
    optimizer = torch.optim.SGD(ddp.parameters(), lr=0.1)
    dataset = TensorDataset(torch.randn(16, 4), torch.randn(16, 2))
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = td.DeviceLoader(DataLoader(dataset, batch_size=4, sampler=sampler), device)
    loader.set_epoch(1)
    assert sampler.epoch == 1 and len(loader) == 2

    seen = []
    for inputs, targets in loader:
        assert td.device_of((inputs, targets)) == td.device_of(model) == device
        loss = nn.functional.mse_loss(ddp(inputs), targets)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        seen.append(inputs)

    # each rank trained on its own shard, yet DDP kept the replicas identical
    flat = torch.cat([p.detach().flatten() for p in model.parameters()])
    gathered = [torch.zeros_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, flat)
    assert torch.equal(gathered[0], gathered[1])

    path = out_dir / "ddp.pt"
    if rank == 0:
        td.save_checkpoint(path, model=ddp, optimizer=optimizer, epoch=1)
    dist.barrier()
    fresh = DistributedDataParallel(nn.Linear(4, 2))
    fresh_optimizer = torch.optim.SGD(fresh.parameters(), lr=0.5)
    ckpt = td.load_checkpoint(path, fresh, fresh_optimizer)  # a DDP-wrapped target
    assert ckpt["epoch"] == 1
    assert torch.equal(fresh.module.weight, model.weight)
    assert fresh_optimizer.param_groups[0]["lr"] == 0.1

    rows = sum(len(batch) for batch in seen)
    (out_dir / f"rank{rank}.ok").write_text(f"{device} {rows}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
