"""The inputs are moved to the device, the labels are not."""

import torch
import torch.nn as nn

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
model = nn.Linear(10, 3).to(device)
criterion = nn.CrossEntropyLoss()
inputs, labels = torch.randn(16, 10), torch.randint(0, 3, (16,))

inputs = inputs.to(device)
outputs = model(inputs)
loss = criterion(outputs, labels)  # expect: TD112 culprit=labels
loss.backward()
