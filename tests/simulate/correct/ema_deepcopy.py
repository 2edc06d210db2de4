"""An exponential moving average of the weights kept in a deepcopy of the model."""

import copy

import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"

model = nn.Sequential(nn.Linear(12, 24), nn.BatchNorm1d(24), nn.ReLU(), nn.Linear(24, 4))
model.to(device)
ema = copy.deepcopy(model).eval()
for p in ema.parameters():
    p.requires_grad_(False)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
X, y = torch.randn(96, 12), torch.randint(0, 4, (96,))
for step in range(6):
    xb, yb = X[step * 16 : (step + 1) * 16].to(device), y[step * 16 : (step + 1) * 16].to(device)
    loss = nn.functional.cross_entropy(model(xb), yb)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    with torch.no_grad():
        for e, p in zip(ema.parameters(), model.parameters(), strict=True):
            e.mul_(0.9).add_(p.detach(), alpha=0.1)
        for e, b in zip(ema.buffers(), model.buffers(), strict=True):
            e.copy_(b)
    print(step, f"{loss.item():.8f}")
with torch.no_grad():
    print("ema", f"{ema(X.to(device)).sum().item():.6f}")
