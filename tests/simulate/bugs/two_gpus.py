"""Naive model parallelism: the activations are never moved to the second GPU."""

# simulate with: devices=2

import torch
import torch.nn as nn

two = torch.cuda.device_count() > 1
first, second = ("cuda:0", "cuda:1") if two else ("cpu", "cpu")


class Pipeline(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.front = nn.Linear(6, 12).to(first)
        self.back = nn.Linear(12, 2).to(second)

    def forward(self, x):
        h = torch.relu(self.front(x.to(first)))
        return self.back(h)  # expect: TD120 culprit=h


print(Pipeline()(torch.randn(3, 6)).shape)
