"""Conv2d 3x3 (stride 1, pad 1) + bias + ReLU: the first layer of a VGG-style network.

RGB input (3 channels) to 64 channels at 224x224, written the usual way: an NCHW
nn.Conv2d followed by torch.relu. The output is ~21x larger than the input, so
how the output is laid out and written matters as much as the arithmetic.
"""
import torch
import torch.nn as nn

BATCH, CHANNELS, HEIGHT, WIDTH = 2, 3, 224, 224
OUT_CHANNELS, KERNEL = 64, 3


class Model(nn.Module):
    def __init__(self, in_channels, out_channels, kernel_size):
        super().__init__()
        self.conv = nn.Conv2d(in_channels, out_channels, kernel_size, padding=kernel_size // 2)

    def forward(self, x):
        return torch.relu(self.conv(x))


def get_inputs():
    return [torch.randn(BATCH, CHANNELS, HEIGHT, WIDTH)]


def get_init_inputs():
    return [CHANNELS, OUT_CHANNELS, KERNEL]
