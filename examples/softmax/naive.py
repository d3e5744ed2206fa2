"""Unfused softmax: the textbook formula as separate PyTorch ops.

No attempt at speed: it materialises the shifted logits, the exponentials and the
row sums as full temporaries, so it reads and writes memory about five times.
It exists as a correct baseline that is no faster than the reference.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits):
        shifted = logits - torch.max(logits, dim=-1, keepdim=True).values
        e = shifted.exp()
        return e / torch.sum(e, dim=-1, keepdim=True)
