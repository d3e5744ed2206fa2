"""Convolution as explicit im2col + matmul (unfold, GEMM, fold back) + bias + ReLU.

The classic lowering: F.unfold builds the (C*k*k) x (H*W) patch matrix per image
(9x the input size for a 3x3 kernel), one matmul applies all filters, then bias
and ReLU. Correct but memory-hungry, so it is not expected to beat the oneDNN
convolution the reference uses.
"""
import torch
import torch.nn as nn
import torch.nn.functional as F


class ModelNew(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x):
        n, _, h, w = x.shape
        k = self.conv.kernel_size[0]
        cols = F.unfold(x, k, padding=self.conv.padding[0])        # (N, C*k*k, H*W)
        wmat = self.conv.weight.reshape(self.conv.out_channels, -1)  # (O, C*k*k)
        out = torch.matmul(wmat, cols) + self.conv.bias.view(1, -1, 1)
        return torch.relu(out).view(n, -1, h, w)
