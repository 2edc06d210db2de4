"""`x.to(device)` as a statement: Tensor.to is not in place, so x stays on the CPU."""

import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(nn.Linear(5, 4), nn.ReLU(), nn.Linear(4, 1)).to(device)
x = torch.randn(3, 5)
x.to(device)
print(model(x).shape)  # expect: TD102 culprit=x
