"""An LSTM classifier over variable-length sequences with pack_padded_sequence."""

import torch
import torch.nn as nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence, pad_sequence

torch.manual_seed(0)
device = "cuda" if torch.cuda.is_available() else "cpu"


class Classifier(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(30, 16, padding_idx=0)
        self.lstm = nn.LSTM(16, 24, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(48, 2)

    def forward(self, tokens, lengths):
        packed = pack_padded_sequence(
            self.embed(tokens), lengths.cpu(), batch_first=True, enforce_sorted=False
        )
        output, _ = self.lstm(packed)
        padded, out_lengths = pad_packed_sequence(output, batch_first=True)
        mean = padded.sum(1) / out_lengths.to(padded.device).unsqueeze(1)
        return self.head(mean)


sequences = [torch.randint(1, 30, (int(n),)) for n in torch.randint(3, 12, (48,))]
labels = torch.tensor([int(s.sum()) % 2 for s in sequences])
model = Classifier().to(device)
optimizer = torch.optim.RMSprop(model.parameters(), lr=3e-3)
for epoch in range(3):
    for i in range(0, 48, 16):
        chunk = sequences[i : i + 16]
        tokens = pad_sequence(chunk, batch_first=True).to(device)
        lengths = torch.tensor([len(s) for s in chunk], device=device)
        loss = nn.functional.cross_entropy(model(tokens, lengths), labels[i : i + 16].to(device))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    h0 = torch.zeros(4, 3, 24, device=device)
    out, _ = model.lstm(model.embed(tokens[:3]), (h0, h0.clone()))
    print(epoch, f"{loss.item():.8f}", f"{out.abs().sum().item():.5f}")
