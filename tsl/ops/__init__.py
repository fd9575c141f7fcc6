"""Operators: shapes, dtypes, a TE definition and a NumPy reference each."""

from .defs import batch_matmul, conv2d, dense, matmul
from .epilogue import Epilogue, bias, clip, gelu, relu, requantize, residual, scale, shift, silu
from .operator import Operator, Tensor
from .sym import Family, Sym, sym

__all__ = ["matmul", "batch_matmul", "dense", "conv2d", "bias", "relu", "requantize",
           "shift", "clip",
           "Epilogue", "Operator", "Tensor", "sym", "Sym", "Family"]
