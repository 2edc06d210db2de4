"""A tiny model whose loss turns NaN: log of a softmax that underflows, with a huge lr.

    python train.py                                   # prints `loss nan` from step 3 on
    torchdoctor run --detect-nonfinite train.py       # names where the first NaN came from
"""

import torch
from torch import nn


class Head(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(16, 3)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.softmax(self.fc(x), -1).log()  # log(0) once a probability underflows


torch.manual_seed(0)
model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), Head())
optimizer = torch.optim.SGD(model.parameters(), lr=50.0)
x, y = torch.randn(8, 4), torch.randint(0, 3, (8,))
for step in range(1, 6):
    loss = nn.functional.nll_loss(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.4f}")
