import torch
import torch.nn as nn

class ModelNew(nn.Module):
    def __init__(self, in_features, out_features, scale):
        super(ModelNew, self).__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        return torch.tanh(self.linear(x)).mul_(self.scale)
