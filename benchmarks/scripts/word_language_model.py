"""An LSTM language model trained the way pytorch/examples' word_language_model does it.

Written for the benchmark (no third-party code): batchify a token stream, truncated
BPTT with the hidden state detached between batches, gradient clipping, a manual
SGD update, evaluation under no_grad. Synthetic tokens, so it runs anywhere.
"""

import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class RNNModel(nn.Module):
    def __init__(self, ntoken: int, ninp: int, nhid: int, nlayers: int, dropout: float = 0.2):
        super().__init__()
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid = nlayers, nhid

    def forward(self, tokens, hidden):
        emb = self.drop(self.encoder(tokens))
        output, hidden = self.rnn(emb, hidden)
        decoded = self.decoder(self.drop(output)).view(-1, self.decoder.out_features)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (
            weight.new_zeros(self.nlayers, bsz, self.nhid),
            weight.new_zeros(self.nlayers, bsz, self.nhid),
        )


def batchify(data, bsz, device):
    nbatch = data.size(0) // bsz
    return data[: nbatch * bsz].view(bsz, -1).t().contiguous().to(device)


def get_batch(source, i, bptt):
    seq_len = min(bptt, len(source) - 1 - i)
    return source[i : i + seq_len], source[i + 1 : i + 1 + seq_len].view(-1)


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def evaluate(model, source, bptt, criterion):
    model.eval()
    total = 0.0
    hidden = model.init_hidden(source.size(1))
    with torch.no_grad():
        for i in range(0, source.size(0) - 1, bptt):
            data, targets = get_batch(source, i, bptt)
            output, hidden = model(data, hidden)
            hidden = repackage_hidden(hidden)
            total += len(data) * criterion(output, targets).item()
    return total / (len(source) - 1)


def main():
    torch.manual_seed(1111)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    ntokens, bptt, lr, clip = 2000, 35, 20.0, 0.25
    corpus = torch.randint(0, ntokens, (12000,))
    train_data = batchify(corpus[:10000], 20, device)
    val_data = batchify(corpus[10000:], 10, device)
    model = RNNModel(ntokens, 64, 128, 2).to(device)
    criterion = nn.NLLLoss()
    model.train()
    hidden = model.init_hidden(20)
    total_loss, batches = 0.0, 0
    for i in range(0, train_data.size(0) - 1, bptt):
        data, targets = get_batch(train_data, i, bptt)
        model.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), clip)
        for p in model.parameters():
            p.data.add_(p.grad, alpha=-lr)
        total_loss += loss.item()
        batches += 1
    val_loss = evaluate(model, val_data, bptt, criterion)
    print(f"batches {batches} | train loss {total_loss / batches:.3f}")
    print(f"valid loss {val_loss:.3f} | ppl {math.exp(val_loss):.1f}")


if __name__ == "__main__":
    main()
