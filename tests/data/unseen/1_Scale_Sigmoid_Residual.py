import torch
import torch.nn as nn

class Model(nn.Module):
    """An elementwise chain: scale, sigmoid gate, residual add, clamp."""
    def __init__(self, alpha, limit):
        super(Model, self).__init__()
        self.alpha = alpha
        self.limit = limit

    def forward(self, x):
        y = x * self.alpha
        y = y * torch.sigmoid(y)
        y = y + x
        return torch.clamp(y, -self.limit, self.limit)

batch_size = 64
features = 8192
alpha = 1.7
limit = 3.0

def get_inputs():
    return [torch.randn(batch_size, features)]

def get_init_inputs():
    return [alpha, limit]
