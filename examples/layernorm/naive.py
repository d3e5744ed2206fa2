"""LayerNorm with torch.var_mean and rsqrt: fewer Python-level ops, same passes.

A straightforward rewrite that still materialises x - mean, the normalised
tensor and the affine result as full-size temporaries, so it is not expected to
be much faster than the reference. Parameters are created exactly as in Model.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))
        self.bias = nn.Parameter(0.1 * torch.randn(hidden))

    def forward(self, x):
        var, mean = torch.var_mean(x, dim=-1, keepdim=True, unbiased=False)
        return (x - mean) * torch.rsqrt(var + self.eps) * self.weight + self.bias
