"""LayerNorm over the hidden dimension, written out as mean / variance / normalise.

This is how many research code bases (and older transformer implementations)
spell LayerNorm. The affine weight and bias are random-initialised parameters so
the check covers them too.
"""
import torch
import torch.nn as nn

BATCH, SEQ, HIDDEN = 8, 256, 1024
EPS = 1e-5


class Model(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))
        self.bias = nn.Parameter(0.1 * torch.randn(hidden))

    def forward(self, x):
        mean = x.mean(dim=-1, keepdim=True)
        var = ((x - mean) ** 2).mean(dim=-1, keepdim=True)
        x_hat = (x - mean) / torch.sqrt(var + self.eps)
        return x_hat * self.weight + self.bias


def get_inputs():
    return [torch.randn(BATCH, SEQ, HIDDEN) * 3.0 + 0.5]


def get_init_inputs():
    return [HIDDEN, EPS]
