import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Linear, row-wise max kept as a column, minus its own mean over that single column.
    The result is zero for every input: a reference no candidate can be checked against.
    """
    def __init__(self, in_features, out_features):
        super(Model, self).__init__()
        self.linear = nn.Linear(in_features, out_features)

    def forward(self, x):
        x = self.linear(x)
        x = torch.max(x, dim=1, keepdim=True).values
        return x - x.mean(dim=1, keepdim=True)

batch_size = 64
in_features = 128
out_features = 128

def get_inputs():
    return [torch.rand(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features]
