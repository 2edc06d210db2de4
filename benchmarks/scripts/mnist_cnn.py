"""A CNN classifier trained the way pytorch/examples' mnist does it, on synthetic images.

Written for the benchmark (no third-party code): a DataLoader over a TensorDataset,
two conv layers with dropout, Adadelta with a StepLR schedule, a test pass under
no_grad that counts correct predictions.
"""

import torch
import torch.nn as nn
import torch.nn.functional as F
from torch.optim.lr_scheduler import StepLR
from torch.utils.data import DataLoader, TensorDataset


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = nn.Conv2d(1, 16, 3, 1)
        self.conv2 = nn.Conv2d(16, 32, 3, 1)
        self.dropout1 = nn.Dropout(0.25)
        self.dropout2 = nn.Dropout(0.5)
        self.fc1 = nn.Linear(4608, 64)
        self.fc2 = nn.Linear(64, 10)

    def forward(self, x):
        x = F.relu(self.conv1(x))
        x = F.max_pool2d(F.relu(self.conv2(x)), 2)
        x = torch.flatten(self.dropout1(x), 1)
        x = self.dropout2(F.relu(self.fc1(x)))
        return F.log_softmax(self.fc2(x), dim=1)


def train(model, device, loader, optimizer):
    model.train()
    for data, target in loader:
        data, target = data.to(device), target.to(device)
        optimizer.zero_grad()
        loss = F.nll_loss(model(data), target)
        loss.backward()
        optimizer.step()
    return loss.item()


def test(model, device, loader):
    model.eval()
    correct = 0
    with torch.no_grad():
        for data, target in loader:
            data, target = data.to(device), target.to(device)
            correct += model(data).argmax(dim=1).eq(target).sum().item()
    return correct


def main():
    torch.manual_seed(1)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    images, labels = torch.randn(1024, 1, 28, 28), torch.randint(0, 10, (1024,))
    train_loader = DataLoader(
        TensorDataset(images[:768], labels[:768]), batch_size=64, shuffle=True
    )
    test_loader = DataLoader(TensorDataset(images[768:], labels[768:]), batch_size=128)
    model = Net().to(device)
    optimizer = torch.optim.Adadelta(model.parameters(), lr=1.0)
    scheduler = StepLR(optimizer, step_size=1, gamma=0.7)
    for epoch in range(2):
        loss = train(model, device, train_loader, optimizer)
        correct = test(model, device, test_loader)
        scheduler.step()
        print(f"epoch {epoch} loss {loss:.3f} correct {correct}/256")


if __name__ == "__main__":
    main()
