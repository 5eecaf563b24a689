"""qlinear quantize on what PyTorch's exporter writes: a small transformer trained on text, exported with dynamo.

torch.onnx.export(dynamo=True) writes opset 18+ graphs with LayerNormalization
and Gelu as single ops, the causal mask as a constant of -3.4e38 added to the
scores, and every Linear as MatMul + Add. The quantizer must fuse every
weight MatMul, keep the element-wise path float, and keep the model's answers.
"""

from __future__ import annotations

import sysconfig
import warnings
from collections import Counter
from pathlib import Path

import numpy as np
import onnx
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("onnxscript", reason="torch.onnx.export(dynamo=True) needs onnxscript (qlinear[torch])")

from torch import nn  # noqa: E402

import qlinear.quantize as qq  # noqa: E402
from qlinear.quantize._fusion import GATHER_CODES  # noqa: E402

VOCAB, CONTEXT, WIDTH = 96, 16, 32


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.qkv, self.o = nn.Linear(WIDTH, 3 * WIDTH), nn.Linear(WIDTH, WIDTH)
        self.fc1, self.fc2 = nn.Linear(WIDTH, 4 * WIDTH), nn.Linear(4 * WIDTH, WIDTH)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        q, k, v = self.qkv(self.ln1(x)).chunk(3, dim=-1)
        attn = torch.softmax(q @ k.transpose(1, 2) * WIDTH**-0.5 + mask, -1)
        x = x + self.o(attn @ v)
        return x + self.fc2(nn.functional.gelu(self.fc1(self.ln2(x))))


class CharModel(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(2))
        self.ln, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        mask = torch.triu(torch.full((CONTEXT, CONTEXT), -3.4e38), 1)
        x = self.embed(ids)
        for b in self.blocks:
            x = b(x, mask)
        return self.head(self.ln(x))


def _text_tokens() -> np.ndarray:
    """Python's own textwrap and argparse sources as tokens (printable ASCII and newline)."""
    root = Path(sysconfig.get_paths()["stdlib"])
    b = np.frombuffer((root / "textwrap.py").read_bytes() + (root / "argparse.py").read_bytes(), np.uint8)
    b = b[((b >= 32) & (b < 127)) | (b == 10)]
    return np.where(b == 10, 95, b.astype(np.int64) - 32)


def _windows(tokens: np.ndarray, count: int, seed: int) -> np.ndarray:
    starts = np.random.default_rng(seed).integers(0, tokens.size - CONTEXT - 1, count)
    return tokens[starts[:, None] + np.arange(CONTEXT)[None, :]]


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    torch.manual_seed(0)
    tokens = _text_tokens()
    split = int(tokens.size * 0.9)
    model = CharModel()
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for step in range(150):
        x = torch.from_numpy(_windows(tokens[: split + 1], 32, step))
        y = torch.from_numpy(_windows(tokens[1 : split + 1], 32, step))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x).reshape(-1, VOCAB), y.reshape(-1)).backward()
        opt.step()
    model.eval()
    path = tmp_path_factory.mktemp("exported") / "char.onnx"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        torch.onnx.export(
            model, (torch.zeros(2, CONTEXT, dtype=torch.int64),), str(path), dynamo=True, dynamic_shapes=({0: "N"},)
        )
    return str(path), _windows(tokens[:split], 320, 1), _windows(tokens[split:], 160, 2)


def test_a_dynamo_exported_transformer_quantizes_with_every_weight_matmul_fused(exported):
    path, cal, held_out = exported
    ops = Counter(n.op_type for n in onnx.load(path).graph.node)
    assert ops["LayerNormalization"] == 5 and ops["Gelu"] == 2 and ops["Softmax"] == 2  # what the exporter writes
    r = qq.quantize_model(path, None, {"ids": cal}, eval={"ids": held_out}, promote=False).report
    kinds = {n.name: (n.op_type, n.weight_type, n.runs_as) for n in r.nodes}
    # With a bias, a MatMul on the (batch, length, width) input becomes a Gemm between Reshapes: QGemm adds the bias.
    weight_matmuls = [k for k in kinds.values() if k[0] in ("MatMul", "Gemm") and k[1] == "int8"]
    assert len(weight_matmuls) == 9  # qkv, o, fc1, fc2 in each block, and the head
    assert all(runs in ("QGemm", "MatMulIntegerToFloat", "QLinearMatMul") for _, _, runs in weight_matmuls)
    assert [k[2] for k in kinds.values() if k[0] == "Gather"] == [GATHER_CODES]  # the embedding gathers its codes
    assert r.fusion.unfused == [] and not [w for w in r.warnings if "ONNX Runtime runs" in w]
    # The mask, the LayerNorms, Gelu and Softmax stay float: only the compute nodes are quantized.
    assert {k[0] for k in kinds.values()} <= {"MatMul", "Gemm", "Gather"}
    assert r.output.sqnr_db > 38 and r.output.top1_agreement > 0.99
