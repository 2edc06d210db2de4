"""The initial hidden state is made by the caller and passed in unmoved."""

import torch
import torch.nn as nn


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(5, 7, batch_first=True)

    def forward(self, x, h):
        out, _ = self.rnn(x, h)  # expect: TD112 culprit=h
        return out


device = "cuda" if torch.cuda.is_available() else "cpu"
model = Tagger().to(device)
h = torch.zeros(1, 2, 7)
print(model(torch.randn(2, 4, 5, device=device), h).shape)
