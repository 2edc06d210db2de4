"""A recurrent model whose initial hidden state is built without a device."""

import torch
import torch.nn as nn


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.rnn = nn.GRU(5, 7, batch_first=True)
        self.out = nn.Linear(7, 3)

    def init_hidden(self, batch: int) -> torch.Tensor:
        return torch.zeros(1, batch, 7)

    def forward(self, x):
        h0 = self.init_hidden(x.size(0))
        out, _ = self.rnn(x, h0)  # expect: TD103 culprit=h0
        return self.out(out)


device = "cuda" if torch.cuda.is_available() else "cpu"
model = Tagger().to(device)
print(model(torch.randn(2, 4, 5, device=device)).shape)
