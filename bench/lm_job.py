"""The second headline job: a small GPT-style language model, the kind of job whose rate of
collectives is higher than the CNN's (issue 56): 0.87 M parameters (4 layers, width 128, 4
heads, a 256-token vocabulary, 64-token context), its causal mask a registered buffer, so
DDP broadcasts it at every forward, and DDP's default buckets (two for this model): three
collectives a step, ~50 ms steps at batch 8 on this machine. Trained by ``cnn_job.py``'s
loop, with its options and its ``BENCH`` line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).resolve().parent))

import cnn_job  # noqa: E402

VOCAB, WIDTH, HEADS, LAYERS, CONTEXT = 256, 128, 4, 4, 64


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(WIDTH), nn.LayerNorm(WIDTH)
        self.attn = nn.MultiheadAttention(WIDTH, HEADS, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(WIDTH, 4 * WIDTH), nn.GELU(),
                                 nn.Linear(4 * WIDTH, WIDTH))

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.attn(h, h, h, attn_mask=mask, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class TinyGPT(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(VOCAB, WIDTH), nn.Embedding(CONTEXT, WIDTH)
        self.blocks = nn.ModuleList(Block() for _ in range(LAYERS))
        self.ln, self.head = nn.LayerNorm(WIDTH), nn.Linear(WIDTH, VOCAB, bias=False)
        self.register_buffer("mask", torch.triu(torch.ones(CONTEXT, CONTEXT, dtype=torch.bool),
                                                diagonal=1))

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        x = self.tok(idx) + self.pos(torch.arange(idx.shape[1]))
        for block in self.blocks:
            x = block(x, self.mask)
        return self.head(self.ln(x)).flatten(0, 1)  # (batch * context, vocab)


def batch(args: argparse.Namespace) -> tuple[torch.Tensor, torch.Tensor]:
    idx = torch.randint(0, VOCAB, (args.batch, CONTEXT + 1))
    return idx[:, :-1], idx[:, 1:].flatten()


if __name__ == "__main__":
    cnn_job.main(lambda _args: TinyGPT(), batch)
