"""A small MLP classifier trained with Adam; prints the loss of every epoch."""

import torch
import torch.nn as nn

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")

model = nn.Sequential(nn.Linear(20, 64), nn.ReLU(), nn.Dropout(0.1), nn.Linear(64, 3)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, weight_decay=1e-4)
X = torch.randn(256, 20)
y = (X[:, 0] > 0).long() + (X[:, 1] > 0.5).long()

for epoch in range(4):
    model.train()
    total = 0.0
    for i in range(0, len(X), 32):
        xb, yb = X[i : i + 32].to(device), y[i : i + 32].to(device)
        loss = nn.functional.cross_entropy(model(xb), yb)
        optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        total += loss.item()
    model.eval()
    with torch.no_grad():
        accuracy = (model(X.to(device)).argmax(1).cpu() == y).float().mean().item()
    print(f"epoch {epoch} loss {total:.8f} accuracy {accuracy:.4f}")
print("checksum", sum(p.double().sum().item() for p in model.parameters()))
