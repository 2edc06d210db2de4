"""Train the classifier on synthetic data, on whatever device is available.

    torchdoctor check examples/fixed
    torchdoctor run --simulate cuda examples/fixed/train.py
"""

import os
import tempfile

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from model import TextClassifier

VOCAB, DIM, CLASSES, SEQ = 1000, 64, 4, 32


def make_data(n):
    labels = torch.randint(0, CLASSES, (n,))
    # each class draws its tokens from its own slice of the vocabulary: easy to learn
    tokens = labels[:, None] * (VOCAB // CLASSES) + torch.randint(0, VOCAB // CLASSES, (n, SEQ))
    mask = torch.ones(n, SEQ, dtype=torch.bool)
    return TensorDataset(tokens, mask, labels)


@torch.no_grad()
def evaluate(model, loader, criterion, device):
    model.eval()
    correct, total_loss = 0, 0.0
    for tokens, mask, labels in loader:
        tokens, mask, labels = tokens.to(device), mask.to(device), labels.to(device)
        logits = model(tokens, mask)
        total_loss += criterion(logits, labels).item()
        correct += (logits.argmax(dim=1) == labels).sum().item()
    return total_loss / len(loader), correct / len(loader.dataset)


def main():
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    train_loader = DataLoader(make_data(512), batch_size=32, shuffle=True, num_workers=2)
    val_loader = DataLoader(make_data(128), batch_size=32, num_workers=2)

    model = TextClassifier(VOCAB, DIM, CLASSES).to(device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    criterion = nn.CrossEntropyLoss()
    scaler = torch.amp.GradScaler("cuda", enabled=device.type == "cuda")

    for epoch in range(3):
        model.train()
        running_loss = 0.0
        for tokens, mask, labels in train_loader:
            tokens, mask, labels = tokens.to(device), mask.to(device), labels.to(device)
            optimizer.zero_grad(set_to_none=True)
            with torch.autocast(device.type, enabled=device.type == "cuda"):
                loss = criterion(model(tokens, mask), labels)
            scaler.scale(loss).backward()
            scaler.step(optimizer)
            scaler.update()
            running_loss += loss.item()
        val_loss, accuracy = evaluate(model, val_loader, criterion, device)
        print(
            f"epoch {epoch}: train loss {running_loss / len(train_loader):.3f} "
            f"val loss {val_loss:.3f} accuracy {accuracy:.2f}"
        )

    with tempfile.TemporaryDirectory(prefix="torchdoctor-demo-") as out_dir:
        path = os.path.join(out_dir, "weights.pt")
        torch.save(model.state_dict(), path)
        model.load_state_dict(torch.load(path, map_location=device))
        print("saved and reloaded", os.path.basename(path))


if __name__ == "__main__":
    main()
