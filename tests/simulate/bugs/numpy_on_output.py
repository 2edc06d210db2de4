"""Predictions turned into a NumPy array straight from the device."""

import numpy as np
import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Linear(4, 2).to(device)
with torch.no_grad():
    logits = model(torch.randn(5, 4, device=device))
predictions = logits.argmax(dim=1).numpy()  # expect: TD106 culprit=logits
print(np.bincount(predictions, minlength=2))
