"""A causal mask kept as a plain attribute (not a buffer), used through an expression."""

import torch
import torch.nn as nn


class Attention(nn.Module):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.qk = nn.Linear(4, 8)
        self.mask = torch.tril(torch.ones(size, size))  # not registered: model.to() skips it

    def forward(self, x):
        q, k = self.qk(x).split(4, dim=-1)
        att = q @ k.transpose(-2, -1)
        t = x.size(1)
        att = att.masked_fill(self.mask[:t, :t] == 0, 0.0)  # expect: TD104 culprit=model.attn.mask
        return att.softmax(-1)


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.attn = Attention(8)

    def forward(self, x):
        return self.attn(x)


device = "cuda" if torch.cuda.is_available() else "cpu"
model = Block().to(device)
print(model(torch.randn(2, 5, 4, device=device)).shape)
