"""Triton's CPU interpreter as a stand-in for a GPU in the CPU suite (tests/utils/test_exact_triton.py).

The interpreter runs `tl.dot` as numpy's matmul of the whole tile, and numpy's BLAS rounds a tile row's dot product
by the row's place in the tile (its micro-kernels take rows in groups). A GPU's matrix instruction computes every
element of a tile alike. `patch_dot` makes the interpreter's dot per element too (float64 products and sums,
rounded once to the accumulator's dtype), so that a test of exact mode's kernels under the interpreter checks their
own reduction order, which is what they control, and not numpy's.
"""

from __future__ import annotations

import os


def patch_dot() -> None:
    """Set TRITON_INTERPRET=1 (before Triton is imported) and make the interpreter's tl.dot per element."""
    os.environ["TRITON_INTERPRET"] = "1"
    import numpy as np
    from triton.runtime.interpreter import InterpreterBuilder, TensorHandle

    def create_dot(self, a, b, d, input_precision, max_num_imprecise_acc):
        exact = np.matmul(a.data.astype(np.float64), b.data.astype(np.float64)) + d.data.astype(np.float64)
        return TensorHandle(exact.astype(d.data.dtype), d.dtype.scalar)

    InterpreterBuilder.create_dot = create_dot
