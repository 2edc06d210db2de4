"""Mixed-precision training as written for GPUs: autocast + GradScaler, enabled only on CUDA.

On the CPU both are disabled; under the simulation CUDA autocast is a no-op on the
CPU tensors and GradScaler scales by powers of two, so the numbers are identical.
"""

import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
use_amp = device == "cuda"

model = nn.Sequential(nn.Linear(16, 32), nn.GELU(), nn.LayerNorm(32), nn.Linear(32, 1)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
scaler = torch.amp.GradScaler(device, enabled=use_amp)
X, Y = torch.randn(128, 16), torch.randn(128, 1)
for step in range(8):
    x, y = X[step * 16 : (step + 1) * 16].to(device), Y[step * 16 : (step + 1) * 16].to(device)
    with torch.autocast(device_type=device, dtype=torch.float16, enabled=use_amp):
        loss = nn.functional.mse_loss(model(x), y)
    optimizer.zero_grad()
    scaler.scale(loss).backward()
    scaler.unscale_(optimizer)
    torch.nn.utils.clip_grad_norm_(model.parameters(), 5.0)
    scaler.step(optimizer)
    scaler.update()
    print(step, f"{loss.item():.8f}")
print("weights", f"{model[0].weight.sum().item():.6f}")
