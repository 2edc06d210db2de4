"""A Dataset served by DataLoader worker processes with pin_memory and non_blocking copies."""

import torch
import torch.nn as nn
from torch.utils.data import DataLoader, Dataset


class Squares(Dataset):
    def __len__(self) -> int:
        return 96

    def __getitem__(self, i: int):
        x = torch.full((8,), float(i) / 96)
        return {"x": x, "y": torch.tensor(float(i % 7))}


def main() -> None:
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    loader = DataLoader(
        Squares(),
        batch_size=16,
        shuffle=True,
        num_workers=2,
        pin_memory=torch.cuda.is_available(),
        generator=torch.Generator().manual_seed(1),
    )
    model = nn.Linear(8, 1).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for epoch in range(2):
        total = 0.0
        for batch in loader:
            x = batch["x"].to(device, non_blocking=True)
            y = batch["y"].to(device, non_blocking=True)
            loss = nn.functional.mse_loss(model(x).squeeze(1), y)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            total += loss.item()
        print(epoch, f"{total:.8f}")


if __name__ == "__main__":
    main()
