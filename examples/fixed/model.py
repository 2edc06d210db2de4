"""The same text classifier, written to run on any device."""

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
        self.register_buffer("pe", pe, persistent=False)  # moves with the model

    def forward(self, x):
        return x + self.pe[: x.size(1)]


class TextClassifier(nn.Module):
    def __init__(self, vocab, dim, classes, layers=2):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.pos = PositionalEncoding(dim)
        self.blocks = nn.ModuleList(nn.Linear(dim, dim) for _ in range(layers))
        self.drop = nn.Dropout(0.1)  # active in training mode only: model.eval() turns it off
        self.head = nn.Linear(dim, classes)

    def forward(self, tokens, mask):
        x = self.pos(self.embed(tokens))
        cls = x.new_zeros(x.size(0), 1, x.size(2))  # same device and dtype as x
        x = torch.cat([cls, x], dim=1)
        for block in self.blocks:
            x = torch.relu(block(x))
        weights = torch.cat([mask.new_ones(mask.size(0), 1), mask], dim=1).float()
        pooled = (x * weights.unsqueeze(-1)).sum(dim=1) / weights.sum(dim=1, keepdim=True)
        pooled = self.drop(pooled)
        return self.head(pooled)  # logits: CrossEntropyLoss applies log-softmax itself
