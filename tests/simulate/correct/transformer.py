"""A TransformerEncoder language model with a positional-encoding buffer and a causal mask."""

import math

import torch
import torch.nn as nn

torch.manual_seed(0)
device = torch.device("cuda" if torch.cuda.is_available() else "cpu")


class PositionalEncoding(nn.Module):
    def __init__(self, d_model: int, max_len: int = 64) -> None:
        super().__init__()
        position = torch.arange(max_len).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(max_len, d_model)
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return x + self.pe[: x.size(1)]


class TinyLM(nn.Module):
    def __init__(self, vocab: int = 50, d_model: int = 32) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        self.pos = PositionalEncoding(d_model)
        layer = nn.TransformerEncoderLayer(d_model, 4, 64, dropout=0.1, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2)
        self.out = nn.Linear(d_model, vocab)

    def forward(self, tokens):
        mask = nn.Transformer.generate_square_subsequent_mask(tokens.size(1), device=tokens.device)
        h = self.encoder(self.pos(self.embed(tokens)), mask=mask, is_causal=True)
        return self.out(h)


model = TinyLM().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
data = torch.randint(0, 50, (32, 17))
for step in range(6):
    batch = data[(step * 8) % 32 :][:8].to(device)
    logits = model(batch[:, :-1])
    loss = nn.functional.cross_entropy(logits.reshape(-1, 50), batch[:, 1:].reshape(-1))
    optimizer.zero_grad()
    loss.backward()
    optimizer.step()
    print(step, round(loss.item(), 6))
model.eval()
with torch.inference_mode():
    tokens = data[:2, :5].to(device)
    for _ in range(4):
        nxt = model(tokens)[:, -1].argmax(-1, keepdim=True)
        tokens = torch.cat([tokens, nxt], dim=1)
print(tokens.tolist())
