"""LayerNorm through PyTorch's fused kernel.

F.layer_norm computes the row statistics and applies normalise + affine in one
kernel per row, with the row still in cache: about two passes over memory and a
single output allocation, versus roughly eight whole-tensor passes and six
temporaries in the op-by-op reference. Same formula (biased variance, eps inside
the square root), so results agree to float32 round-off.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, hidden, eps):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(1.0 + 0.1 * torch.randn(hidden))
        self.bias = nn.Parameter(0.1 * torch.randn(hidden))

    def forward(self, x):
        return F.layer_norm(x, self.weight.shape, self.weight, self.bias, self.eps)
