"""Reduction: masked mean pooling of token states into one vector per sequence.

This is sentence-embedding pooling (sentence-transformers style): padding tokens
are masked out and the remaining hidden states are averaged over the sequence
axis. Sequences have random lengths, so every output row is a mean over a
different number of tokens.
"""
import torch
import torch.nn as nn

BATCH, SEQ, HIDDEN = 32, 512, 768


class Model(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, hidden, attention_mask):
        m = attention_mask.unsqueeze(-1).to(hidden.dtype)
        summed = (hidden * m).sum(dim=1)
        count = m.sum(dim=1).clamp(min=1e-9)
        return summed / count


def get_inputs():
    hidden = torch.randn(BATCH, SEQ, HIDDEN) + 0.25
    lengths = torch.randint(SEQ // 8, SEQ + 1, (BATCH, 1))
    attention_mask = (torch.arange(SEQ).unsqueeze(0) < lengths).long()
    return [hidden, attention_mask]


def get_init_inputs():
    return []
