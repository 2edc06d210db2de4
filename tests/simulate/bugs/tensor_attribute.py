"""A constant kept as a plain tensor attribute: model.to() does not move it."""

import torch
import torch.nn as nn


class Normalize(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.mean = torch.tensor([0.5, 0.4, 0.3])
        self.head = nn.Linear(3, 1)

    def forward(self, x):
        return self.head(x - self.mean)  # expect: TD104 culprit=model.mean


device = "cuda" if torch.cuda.is_available() else "cpu"
model = Normalize().to(device)
print(model(torch.rand(4, 3).to(device)).sum().item() != 0)
