"""Blocks kept in a plain Python list are not registered: model.to() skips them."""

import torch
import torch.nn as nn


class Stack(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inp = nn.Linear(4, 8)
        self.blocks = [nn.Linear(8, 8) for _ in range(2)]

    def forward(self, x):
        x = self.inp(x)
        for block in self.blocks:
            x = torch.relu(block(x))  # expect: TD105 culprit=model.blocks[0].
        return x


device = "cuda" if torch.cuda.is_available() else "cpu"
model = Stack().to(device)
print(model(torch.randn(3, 4, device=device)).shape)
