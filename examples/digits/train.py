"""Train a small CNN on an ImageFolder tree of grayscale images; prints key=value metrics.

Needs only torch, numpy and Pillow (the `pytorch` template). Uses the GPU when the instance
has one (CUDA_VISIBLE_DEVICES is set by gpulease to exactly the instance's GPUs).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn


def load_split(root: Path, size: int) -> tuple[torch.Tensor, torch.Tensor, list[str]]:
    classes = sorted(p.name for p in root.iterdir() if p.is_dir())
    images, labels = [], []
    for label, name in enumerate(classes):
        for file in sorted((root / name).glob("*.png")):
            img = Image.open(file).convert("L").resize((size, size))
            images.append(np.asarray(img, dtype=np.float32) / 255.0)
            labels.append(label)
    x = torch.from_numpy(np.stack(images)).unsqueeze(1)
    return x, torch.tensor(labels), classes


class SmallCNN(nn.Module):
    def __init__(self, classes: int, size: int) -> None:
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(1, 16, 3, padding=1),
            nn.ReLU(),
            nn.Conv2d(16, 32, 3, padding=1),
            nn.ReLU(),
            nn.MaxPool2d(2),
        )
        self.head = nn.Linear(32 * (size // 2) ** 2, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x).flatten(1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--data", type=Path, default=Path("data"))
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--size", type=int, default=8)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--lr", type=float, default=2e-3)
    parser.add_argument("--save", type=Path, default=Path("model.pt"))
    args = parser.parse_args()
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    print(f"device={device.type} name={name!r} torch={torch.__version__}", flush=True)
    x_train, y_train, classes = load_split(args.data / "train", args.size)
    x_val, y_val, _ = load_split(args.data / "val", args.size)
    print(f"train_images={len(x_train)} val_images={len(x_val)} classes={len(classes)}", flush=True)
    x_train, y_train = x_train.to(device), y_train.to(device)
    x_val, y_val = x_val.to(device), y_val.to(device)
    model = SmallCNN(len(classes), args.size).to(device)
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)
    loss_fn = nn.CrossEntropyLoss()
    started = time.monotonic()
    for epoch in range(1, args.epochs + 1):
        model.train()
        order = torch.randperm(len(x_train), device=device)
        total, correct, loss_sum = 0, 0, 0.0
        for i in range(0, len(order), args.batch):
            idx = order[i : i + args.batch]
            logits = model(x_train[idx])
            loss = loss_fn(logits, y_train[idx])
            opt.zero_grad()
            loss.backward()
            opt.step()
            loss_sum += loss.item() * len(idx)
            correct += (logits.argmax(1) == y_train[idx]).sum().item()
            total += len(idx)
        model.eval()
        with torch.no_grad():
            val_acc = (model(x_val).argmax(1) == y_val).float().mean().item()
        print(
            f"epoch={epoch} loss={loss_sum / total:.4f} acc={correct / total:.4f} "
            f"val_acc={val_acc:.4f} elapsed={time.monotonic() - started:.1f}",
            flush=True,
        )
    torch.save(model.state_dict(), args.save)
    print(f"saved={args.save}", flush=True)


if __name__ == "__main__":
    main()
