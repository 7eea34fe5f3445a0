"""The tensor layer: the user's lazy Tensor. Every op builds a tensor-graph UOp; nothing runs until a result is
needed. The class is assembled from one mixin per family of ops, each composed from the few primitive UOps:

  tensor.py       the class: construction, running (realize, numpy, assign), autograd entry points, creation, and
                  the movement primitives (reshape, permute, expand, pad, shrink, flip)
  elementwise.py  binary arithmetic with broadcasting and dtype promotion, comparisons, bitwise ops, casts
  unary.py        unary math and activations
  movement.py     composite movement: squeeze ... cat, stack, repeat, roll, sliding windows, rearrange
  reduce.py       reductions, scans, softmax, sort and topk
  nn_ops.py       matmul and einsum, convolutions, pooling, normalization, losses, attention
  matmul_layout.py  which copy of a matmul's operand the product reads (panels, transposed, padded) and its gradients
  conv_layout.py  a convolution's operand layouts, its weight gradient in parts of the batch, conv_transpose2d
  attention.py    attention's helpers: causal attention gated by its mask, keys read in panels
  indexing.py     __getitem__ / __setitem__, gather, scatter, masked ops, nonzero
  random.py       random numbers and initializers
  helpers.py      argument normalization shared by the mixins (axes, broadcast shapes, pool padding)

Gradients are rewrite rules over the primitive UOps, in zeptograd/gradient.py.
"""

from zeptograd.tensor.tensor import Tensor

__all__ = ["Tensor"]
