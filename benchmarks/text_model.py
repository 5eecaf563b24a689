"""A small character-level transformer trained on real text, for the quantizer benchmarks.

The text is the source of a fixed set of modules of Python's own standard
library (it ships with every Python, so nothing is downloaded): bytes 32-126
and newline become 96 tokens. The model predicts the next character from the
32 before it: a token embedding plus learned positions, two blocks of
single-head causal attention (an additive mask of -3.4e38 above the
diagonal, as exporters write it) and a GELU MLP, each behind a LayerNorm
written out as ReduceMean/Sub/Mul/Sqrt/Div (as exporters write it for older
opsets), residual Adds, and a final LayerNorm and projection to the logits.

It is trained with PyTorch for a fixed number of steps (seeded), then
written op by op with qlinear.onnx.Graph, so the ONNX model is exactly the
trained one.
"""

from __future__ import annotations

import sysconfig
from pathlib import Path

import numpy as np
import onnx

import qlinear.onnx as qo

MODULES = (
    "argparse.py",
    "textwrap.py",
    "difflib.py",
    "pydoc.py",
    "inspect.py",
    "typing.py",
    "dataclasses.py",
    "logging/__init__.py",
)
VOCAB, CONTEXT, WIDTH, LAYERS = 96, 32, 64, 2
MASK = -3.4e38


def corpus() -> np.ndarray:
    """The standard library text as tokens: byte - 32 for printable ASCII, 95 for newline (the rest dropped)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    raw = b"".join((root / m).read_bytes() for m in MODULES)
    b = np.frombuffer(raw, np.uint8)
    b = b[((b >= 32) & (b < 127)) | (b == 10)]
    return np.where(b == 10, 95, b.astype(np.int64) - 32)


def windows(tokens: np.ndarray, count: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """``count`` random windows of CONTEXT tokens and the tokens that follow each position."""
    rng = np.random.default_rng(seed)
    starts = rng.integers(0, tokens.size - CONTEXT - 1, count)
    idx = starts[:, None] + np.arange(CONTEXT)[None, :]
    return tokens[idx], tokens[idx + 1]


def train(steps: int = 700, seed: int = 0):
    """The trained torch model and the held-out split point (the last 10% of the text is never trained on)."""
    import torch
    from torch import nn

    torch.manual_seed(seed)
    tokens = corpus()
    split = int(tokens.size * 0.9)

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
            self.q, self.k, self.v, self.o = (nn.Linear(WIDTH, WIDTH) for _ in range(4))
            self.fc1, self.fc2 = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

        def forward(self, x, mask):
            h = self.ln1(x)
            scores = self.q(h) @ self.k(h).transpose(1, 2) * WIDTH**-0.5 + mask
            x = x + self.o(torch.softmax(scores, -1) @ self.v(h))
            return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))

    class CharTransformer(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(VOCAB, WIDTH)
            self.pos = nn.Parameter(torch.randn(CONTEXT, WIDTH) * 0.1)
            self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
            self.ln = nn.LayerNorm(WIDTH)
            self.head = nn.Linear(WIDTH, VOCAB)

        def forward(self, ids):
            mask = torch.triu(torch.full((CONTEXT, CONTEXT), MASK), 1)
            x = self.embed(ids) + self.pos
            for b in self.blocks:
                x = b(x, mask)
            return self.head(self.ln(x))

    model = CharTransformer()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    rng = np.random.default_rng(seed)
    for _ in range(steps):
        starts = rng.integers(0, split - CONTEXT - 1, 32)
        idx = starts[:, None] + np.arange(CONTEXT)[None, :]
        x, y = torch.from_numpy(tokens[idx]), torch.from_numpy(tokens[idx + 1])
        opt.zero_grad()
        nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1)).backward()
        opt.step()
    return model.eval(), tokens, split


def _layernorm(g: qo.Graph, x: str, gamma: np.ndarray, beta: np.ndarray, eps: float, name: str) -> str:
    mean = g.op("ReduceMean", [x], name=f"{name}_mean", axes=[-1], keepdims=1)
    d = g.op("Sub", [x, mean], name=f"{name}_sub")
    var = g.op("ReduceMean", [g.op("Mul", [d, d], name=f"{name}_sq")], name=f"{name}_var", axes=[-1], keepdims=1)
    std = g.op("Sqrt", [g.op("Add", [var, np.float32(eps)], name=f"{name}_eps")], name=f"{name}_sqrt")
    y = g.op("Div", [d, std], name=f"{name}_div")
    return g.op("Add", [g.op("Mul", [y, gamma], name=f"{name}_gamma"), beta], name=f"{name}_beta")


def _linear(g: qo.Graph, x: str, p: dict, key: str, name: str) -> str:
    return g.op("Add", [g.op("MatMul", [x, p[f"{key}.weight"].T.copy()], name=name), p[f"{key}.bias"]], name=f"{name}_bias")


def to_onnx(model) -> onnx.ModelProto:
    p = {k: v.detach().numpy().astype(np.float32) for k, v in model.state_dict().items()}
    g = qo.Graph("char_transformer", opset=17)
    ids = g.input("ids", "int64", ("N", CONTEXT))
    x = g.op("Add", [g.op("Gather", [p["embed.weight"], ids], name="embed"), p["pos"]], name="add_pos")
    mask = np.triu(np.full((CONTEXT, CONTEXT), MASK, np.float32), 1)
    for i in range(LAYERS):
        b = f"blocks.{i}"
        h = _layernorm(g, x, p[f"{b}.ln1.weight"], p[f"{b}.ln1.bias"], 1e-5, f"b{i}_ln1")
        q, k, v = (_linear(g, h, p, f"{b}.{n}", f"b{i}_{n}") for n in "qkv")
        kt = g.op("Transpose", [k], name=f"b{i}_kt", perm=[0, 2, 1])
        scores = g.op("Mul", [g.op("MatMul", [q, kt], name=f"b{i}_scores"), np.float32(WIDTH**-0.5)], name=f"b{i}_scale")
        attn = g.op("Softmax", [g.op("Add", [scores, mask], name=f"b{i}_mask")], name=f"b{i}_softmax", axis=-1)
        ctx = g.op("MatMul", [attn, v], name=f"b{i}_context")
        x = g.op("Add", [x, _linear(g, ctx, p, f"{b}.o", f"b{i}_o")], name=f"b{i}_res1")
        h = _layernorm(g, x, p[f"{b}.ln2.weight"], p[f"{b}.ln2.bias"], 1e-5, f"b{i}_ln2")
        u = _linear(g, h, p, f"{b}.fc1", f"b{i}_fc1")
        erf = g.op("Erf", [g.op("Div", [u, np.float32(np.sqrt(2))], name=f"b{i}_gelu_div")], name=f"b{i}_gelu_erf")
        act = g.op(
            "Mul",
            [g.op("Mul", [u, g.op("Add", [erf, np.float32(1)], name=f"b{i}_gelu_add")], name=f"b{i}_gelu_mul"), np.float32(0.5)],
            name=f"b{i}_gelu",
        )
        x = g.op("Add", [x, _linear(g, act, p, f"{b}.fc2", f"b{i}_fc2")], name=f"b{i}_res2")
    h = _layernorm(g, x, p["ln.weight"], p["ln.bias"], 1e-5, "ln_f")
    logits = g.op(
        "Add",
        [g.op("MatMul", [h, p["head.weight"].T.copy()], name="head"), p["head.bias"]],
        name="head_bias",
        output_names=["logits"],
    )
    g.output(logits)
    return g.to_model()
