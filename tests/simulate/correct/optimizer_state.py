"""Save model+optimizer state mid-training, reload it into fresh objects and continue."""

import io

import torch
import torch.nn as nn

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


def make():
    model = nn.Sequential(nn.Linear(10, 16), nn.Tanh(), nn.Linear(16, 1)).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, amsgrad=True)


def train(model, optimizer, steps, X, Y):
    for _ in range(steps):
        loss = nn.functional.mse_loss(model(X.to(device)), Y.to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return loss.item()


X, Y = torch.randn(64, 10), torch.randn(64, 1)
model, optimizer = make()
print("first", f"{train(model, optimizer, 5, X, Y):.8f}")
buffer = io.BytesIO()
torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, buffer)
buffer.seek(0)
checkpoint = torch.load(buffer, map_location=device)
model2, optimizer2 = make()
model2.load_state_dict(checkpoint["model"])
optimizer2.load_state_dict(checkpoint["optimizer"])
print("resumed", f"{train(model2, optimizer2, 5, X, Y):.8f}")
print("original", f"{train(model, optimizer, 5, X, Y):.8f}")
