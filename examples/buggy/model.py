"""A small text classifier with the device mistakes that crash only on a GPU."""

import math

import torch
from torch import nn


class PositionalEncoding(nn.Module):
    def __init__(self, dim, max_len=512):
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, dim, 2) * (-math.log(10000.0) / dim))
        pe = torch.zeros(max_len, dim)
        pe[:, 0::2] = torch.sin(position * div)
        pe[:, 1::2] = torch.cos(position * div)
        self.pe = pe  # a plain attribute, not a buffer: model.to(device) leaves it on the CPU

    def forward(self, x):
        return x + self.pe[: x.size(1)]


class TextClassifier(nn.Module):
    def __init__(self, vocab, dim, classes, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = PositionalEncoding(dim)
        # a plain list: these layers are not registered, so not moved and not trained
        self.blocks = [nn.Linear(dim, dim) for _ in range(layers)]
        self.drop = nn.Dropout(0.1)  # active in training mode only: model.eval() turns it off
        self.head = nn.Linear(dim, classes)
        self.softmax = nn.Softmax(dim=-1)

    def forward(self, tokens, mask):
        x = self.pos(self.embed(tokens))
        cls = torch.zeros(x.size(0), 1, x.size(2))  # made on the CPU, whatever x's device
        x = torch.cat([cls, x], dim=1)
        for block in self.blocks:
            x = torch.relu(block(x))
        weights = torch.cat([mask.new_ones(mask.size(0), 1), mask], dim=1).float()
        pooled = (x * weights.unsqueeze(-1)).sum(dim=1) / weights.sum(dim=1, keepdim=True)
        pooled = self.drop(pooled)
        return self.softmax(self.head(pooled))  # probabilities, not logits
