"""Train a small CNN on an ImageFolder tree of grayscale images; prints key=value metrics.

Needs only torch, numpy and Pillow (the `pytorch` template). Uses the GPU when the instance
has one (CUDA_VISIBLE_DEVICES is set by gpulease to exactly the instance's GPUs).

Metrics reach gpulease three ways (docs/metrics.md): each epoch's `epoch=N loss=…` line on
stdout, `track.log` (a no-op outside gpulease; skipped where gpulease is not installed),
and with --tensorboard a SummaryWriter with default settings (needs `tensorboard`).
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np
import torch
from PIL import Image
from torch import nn

try:
    from gpulease import track
except ImportError:  # run where gpulease is not installed
    track = None


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
    parser.add_argument(
        "--tensorboard", action="store_true", help="also write ./runs/ with SummaryWriter()"
    )
    args = parser.parse_args()
    writer = None
    if args.tensorboard:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter()  # default settings: ./runs/<date>_<host>/
    torch.manual_seed(0)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    name = torch.cuda.get_device_name(0) if device.type == "cuda" else "cpu"
    print(f"device={device.type} name={name!r} torch={torch.__version__}", flush=True)
    x_train, y_train, classes = load_split(args.data / "train", args.size)
    x_val, y_val, _ = load_split(args.data / "val", args.size)
    # "data" first: a line of information, not a metrics line (docs/metrics.md)
    print(
        f"data train_images={len(x_train)} val_images={len(x_val)} classes={len(classes)}",
        flush=True,
    )
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
        train_loss, train_acc = loss_sum / total, correct / total
        print(
            f"epoch={epoch} loss={train_loss:.4f} acc={train_acc:.4f} "
            f"val_acc={val_acc:.4f} elapsed={time.monotonic() - started:.1f}",
            flush=True,
        )
        if track is not None:
            track.log(step=epoch, loss=train_loss, acc=train_acc, val_acc=val_acc)
        if writer is not None:
            writer.add_scalar("loss", train_loss, epoch)
            writer.add_scalars("acc", {"train": train_acc, "val": val_acc}, epoch)
            writer.flush()
    if writer is not None:
        writer.close()
    torch.save(model.state_dict(), args.save)
    print(f"saved={args.save}", flush=True)


if __name__ == "__main__":
    main()
