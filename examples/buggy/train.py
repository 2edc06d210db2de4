"""Train the classifier on synthetic data. Runs on a CPU; see what breaks on a GPU.

    torchdoctor check examples/buggy
    torchdoctor run --simulate cuda examples/buggy/train.py
"""

import os
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from model import TextClassifier

VOCAB, DIM, CLASSES, SEQ = 1000, 64, 4, 32
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
torch.manual_seed(0)


def make_data(n):
    labels = torch.randint(0, CLASSES, (n,))
    # each class draws its tokens from its own slice of the vocabulary: easy to learn
    tokens = labels[:, None] * (VOCAB // CLASSES) + torch.randint(0, VOCAB // CLASSES, (n, SEQ))
    mask = torch.ones(n, SEQ, dtype=torch.bool)
    return TensorDataset(tokens, mask, labels)


# workers are started at import time, with no `if __name__ == "__main__":` guard
train_loader = DataLoader(make_data(512), batch_size=32, shuffle=True, num_workers=2)
val_loader = DataLoader(make_data(128), batch_size=32, num_workers=2)

model = TextClassifier(VOCAB, DIM, CLASSES)
optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
model.to(device)
criterion = nn.CrossEntropyLoss()
scaler = torch.cuda.amp.GradScaler(enabled=device.type == "cuda")


def evaluate(model, loader):
    correct, total_loss, predictions = 0, 0.0, []
    for tokens, mask, labels in loader:
        probs = model(tokens, mask)  # the batch never moves to the model's device
        total_loss += criterion(probs, labels)  # keeps every batch's graph alive
        predictions.append(probs.argmax(dim=1).numpy())  # fails for a CUDA tensor
        correct += (probs.argmax(dim=1) == labels).sum().item()
    return total_loss / len(loader), correct / len(loader.dataset)


for epoch in range(3):
    running_loss = 0.0
    for tokens, mask, labels in train_loader:
        tokens, mask, labels = tokens.to(device), mask.to(device), labels.to(device)
        with torch.cuda.amp.autocast(enabled=device.type == "cuda"):
            probs = model(tokens, mask)
            loss = criterion(probs, labels)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        running_loss += loss
    val_loss, accuracy = evaluate(model, val_loader)
    print(f"epoch {epoch}: train loss {running_loss.item() / len(train_loader):.3f} "
          f"val loss {val_loss.item():.3f} accuracy {accuracy:.2f}")


def load_weights(path):
    # inference code, often run on another machine: a CPU-only one fails here
    return torch.load(path)


with tempfile.TemporaryDirectory(prefix="torchdoctor-demo-") as out_dir:
    torch.save(model, os.path.join(out_dir, "model.pt"))
    torch.save(model.state_dict(), os.path.join(out_dir, "weights.pt"))
    state = load_weights(os.path.join(out_dir, "weights.pt"))
    print("saved and reloaded weights.pt")
