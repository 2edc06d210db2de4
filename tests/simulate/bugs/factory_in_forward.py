"""A noise tensor made inside forward() without device= stays on the CPU."""

import torch
import torch.nn as nn


class NoisyEncoder(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.proj = nn.Linear(6, 6)

    def forward(self, x):
        noise = torch.randn(x.shape) * 0.1
        return self.proj(x + noise)  # expect: TD103 culprit=noise


device = "cuda" if torch.cuda.is_available() else "cpu"
model = NoisyEncoder().to(device)
print(model(torch.randn(2, 6, device=device)).shape)
