"""Transformer MLP up-projection: Linear + bias followed by GELU (tanh form).

The GELU is written the way GPT-2 / minGPT ("NewGELU") code writes it, as a chain
of elementwise ops on the matmul output. The matmul itself is cheap here
(K=256), so the epilogue is a large part of the cost.
"""
import math

import torch
import torch.nn as nn

TOKENS, IN_FEATURES, OUT_FEATURES = 2048, 256, 1024


class Model(nn.Module):
    def __init__(self, in_features, out_features):
        super().__init__()
        self.fc = nn.Linear(in_features, out_features)

    def forward(self, x):
        h = self.fc(x)
        return 0.5 * h * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (h + 0.044715 * torch.pow(h, 3.0))))


def get_inputs():
    return [torch.randn(TOKENS, IN_FEATURES)]


def get_init_inputs():
    return [IN_FEATURES, OUT_FEATURES]
