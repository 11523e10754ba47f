"""Train a 3-D embedding on scikit-learn's digits with a few margin losses (library API only).

    python examples/custom_training_loop.py
"""

from __future__ import annotations

import torch
from torch import nn

import marginface
from marginface.data import load_dataset


def train(loss_name: str, epochs: int = 30, seed: int = 0) -> float:
    torch.manual_seed(seed)
    data = load_dataset("digits", seed=seed)
    x_train = torch.from_numpy(data.train.images).flatten(1)
    y_train = torch.from_numpy(data.train.labels)
    x_test = torch.from_numpy(data.test.images).flatten(1)
    y_test = torch.from_numpy(data.test.labels)
    model = nn.Sequential(nn.Linear(64, 128), nn.ReLU(), nn.Linear(128, 3))
    loss_fn = marginface.create_loss(loss_name, num_classes=10, embedding_dim=3, scale=16.0)
    optimizer = torch.optim.AdamW([*model.parameters(), *loss_fn.parameters()], lr=3e-3)
    for _ in range(epochs):
        for batch in torch.randperm(len(y_train)).split(128):
            loss = loss_fn(model(x_train[batch]), y_train[batch])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    with torch.no_grad():
        predicted = loss_fn.cosine(model(x_test)).argmax(dim=1)
    return float((predicted == y_test).float().mean())


if __name__ == "__main__":
    for name in ("normface", "cosface", "arcface", "curricularface"):
        print(f"{name:>15}: test accuracy {train(name):.3f} (3-D embedding, digits)")
