"""Training moves each batch to the device; the evaluation loop forgets to."""

import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
train = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(3)]
val = [(torch.randn(4, 8), torch.randint(0, 2, (4,))) for _ in range(2)]

for x, y in train:
    x, y = x.to(device), y.to(device)
    loss = nn.functional.cross_entropy(model(x), y)
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()

model.eval()
correct = 0
with torch.no_grad():
    for x, y in val:
        correct += (model(x).argmax(1).cpu() == y).sum().item()  # expect: TD112 culprit=x
print("accuracy", correct / 8)
