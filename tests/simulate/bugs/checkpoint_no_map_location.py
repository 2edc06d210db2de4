"""Train on the GPU, then load the checkpoint for CPU inference without map_location.

Run with strict_load: the load fails exactly as it would on a CPU-only machine.
"""

# simulate with: strict_load=True

import os
import tempfile

import torch
import torch.nn as nn

device = "cuda" if torch.cuda.is_available() else "cpu"
model = nn.Linear(3, 1).to(device)
path = os.path.join(tempfile.mkdtemp(), "model.pt")
torch.save(model.state_dict(), path)

cpu_model = nn.Linear(3, 1)
cpu_model.load_state_dict(torch.load(path))  # expect: TD402 culprit=-
print(cpu_model(torch.ones(1, 3)).shape)
