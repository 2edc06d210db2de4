"""A CNN with BatchNorm and SGD+momentum on random images; eval mode uses running stats."""

import torch
import torch.nn as nn
import torch.nn.functional as F

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn1 = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 16, 3, padding=1)
        self.bn2 = nn.BatchNorm2d(16)
        self.head = nn.Linear(16, 5)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.bn1(self.conv1(x))), 2)
        x = F.relu(self.bn2(self.conv2(x)))
        return self.head(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


model = Net().to(device)
optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
images = torch.randn(64, 3, 16, 16)
labels = torch.randint(0, 5, (64,))
for epoch in range(3):
    model.train()
    for i in range(0, 64, 16):
        x, y = images[i : i + 16].to(device), labels[i : i + 16].to(device)
        loss = F.cross_entropy(model(x), y, label_smoothing=0.1)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        optimizer.step()
    scheduler.step()
    model.eval()
    with torch.no_grad():
        logits = model(images.to(device))
    print(epoch, f"{loss.item():.8f}", f"{logits.sum().item():.6f}", scheduler.get_last_lr())
print("running_mean", model.bn2.running_mean.cpu().numpy().round(6).tolist()[:4])
