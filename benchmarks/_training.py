"""The training loop the benchmark models share: cross-entropy on mini-batches of 64, seeded."""

from __future__ import annotations

import numpy as np


def fit(model, x: np.ndarray, y: np.ndarray, *, epochs: int, lr: float, seed: int, optimizer: str = "adam"):
    """``model`` trained ``epochs`` passes over ``(x, y)`` with Adam (or AdamW), shuffled by ``seed``; returned in eval mode."""
    import torch
    from torch import nn

    opt = (torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam)(model.parameters(), lr=lr)
    xt, yt = torch.from_numpy(x), torch.from_numpy(y)
    gen = torch.Generator().manual_seed(seed)
    for _ in range(epochs):
        for batch in torch.randperm(len(xt), generator=gen).split(64):
            opt.zero_grad()
            nn.functional.cross_entropy(model(xt[batch]), yt[batch]).backward()
            opt.step()
    return model.eval()
