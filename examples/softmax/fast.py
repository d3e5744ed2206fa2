"""Softmax through PyTorch's fused kernel.

torch.softmax computes max, exp, sum and the division per row in one kernel that
keeps the row in cache, instead of five whole-tensor passes with four temporaries
(each a fresh allocation the OS has to page in). It is equally stable (it also
subtracts the row max), so results match the reference to float32 round-off.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits):
        return torch.softmax(logits, dim=-1)
