"""Triton softmax: one program normalises a tile of whole rows in a single pass.

Each program loads BLOCK_M complete rows (row width padded to a power of two and
masked), computes the max, exp, sum and division in registers and writes the
result once: one read and one write of the tensor, versus about five round trips
through memory for the op-by-op reference. Several rows per program keep the grid
small for short rows (on a GPU it amortises launch/scheduling; under
TRITON_INTERPRET=1 it is what keeps the interpreter fast enough to test).

On a CPU-only machine this only runs under the Triton interpreter, so its CPU
timing says nothing about GPU speed.

It declares its launch knobs (docs/tuner.md), so `kscout optimize examples/softmax
--start examples/softmax/triton_rows.py` measures it and then tunes them.
"""
import torch
import torch.nn as nn
import triton
import triton.language as tl

TUNABLE = {"ROWS_PER_PROGRAM": [1, 2, 4, 8, 16], "NUM_WARPS": [2, 4, 8, 16]}
ROWS_PER_PROGRAM = 16  # at most; a tile holds no more than 16K elements
NUM_WARPS = 8


@triton.jit
def _softmax_rows(x_ptr, y_ptr, n_rows, n_cols,
                  BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = (rows[:, None] < n_rows) & (cols[None, :] < n_cols)
    offs = rows[:, None] * n_cols + cols[None, :]
    x = tl.load(x_ptr + offs, mask=mask, other=-float("inf")).to(tl.float32)
    x = x - tl.max(x, axis=1)[:, None]
    e = tl.exp(x)  # masked lanes: exp(-inf) = 0, so they do not touch the sum
    y = e / tl.sum(e, axis=1)[:, None]
    tl.store(y_ptr + offs, y.to(y_ptr.dtype.element_ty), mask=mask)


class ModelNew(nn.Module):
    def __init__(self):
        super().__init__()

    def forward(self, logits):
        n_cols = logits.shape[-1]
        x = logits.contiguous().view(-1, n_cols)
        n_rows = x.shape[0]
        block_n = triton.next_power_of_2(n_cols)
        if block_n > 16384:
            raise ValueError("rows wider than 16384 need a multi-pass kernel")
        block_m = max(1, min(ROWS_PER_PROGRAM, 16384 // block_n))  # at most 16K elements per tile
        y = torch.empty_like(x)
        grid = (triton.cdiv(n_rows, block_m),)
        _softmax_rows[grid](x, y, n_rows, n_cols,
                            BLOCK_M=block_m, BLOCK_N=block_n, num_warps=NUM_WARPS)
        return y.view(logits.shape)
