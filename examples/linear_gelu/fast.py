"""addmm with the bias folded in, then GELU applied in place on the matmul output.

The reference runs about eight elementwise passes over the (tokens x out) result
after the matmul, each allocating a fresh temporary. Here the bias is added inside
the GEMM (addmm's beta*C term) and the whole tanh-GELU runs as one vectorised
in-place kernel (aten gelu_ with approximate='tanh' is the same formula), so after
the GEMM there is one read+write pass and no extra allocation.
"""
import torch
import torch.nn as nn


class ModelNew(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        h = torch.addmm(self.fc.bias, x, self.fc.weight.t())
        return torch.ops.aten.gelu_(h, approximate="tanh")
