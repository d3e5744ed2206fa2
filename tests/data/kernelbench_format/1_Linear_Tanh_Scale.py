import torch
import torch.nn as nn

class Model(nn.Module):
    """
    Linear layer, then tanh, then a constant scale (KernelBench level-2 layout).
    """
    def __init__(self, in_features, out_features, scale):
        super(Model, self).__init__()
        self.linear = nn.Linear(in_features, out_features)
        self.scale = scale

    def forward(self, x):
        """
        Args:
            x: Input tensor of shape (batch_size, in_features)
        Returns:
            Output tensor of shape (batch_size, out_features)
        """
        x = self.linear(x)
        x = torch.tanh(x)
        return x * self.scale

batch_size = 128
in_features = 256
out_features = 512
scale = 2.0

def get_inputs():
    return [torch.rand(batch_size, in_features)]

def get_init_inputs():
    return [in_features, out_features, scale]
