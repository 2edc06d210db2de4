"""The issue's script: the batch is moved inside main(), the labels made there are not."""

import torch
import torch.nn as nn


def main():
    torch.manual_seed(0)
    device = "cuda" if torch.cuda.is_available() else "cpu"
    model = nn.Linear(4, 3).to(device)
    x = torch.randn(8, 4).to(device)
    y = torch.randint(0, 3, (8,))
    loss = nn.functional.cross_entropy(model(x), y)  # expect: TD112 culprit=y
    loss.backward()
    print(round(loss.item(), 4))


main()
