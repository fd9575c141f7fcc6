"""Operator descriptions: shapes and dtypes, a TE definition, a NumPy reference.

Every operator is a GEMM-like reduction whose main block is named "C"; each of its loop axes has
a role: "m" (rows of A and C), "n" (columns of B and C), "k" (reduction) or "b" (batch). Schedules
work on roles, so one schedule serves any operator of a family and any machine.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from ..errors import ScheduleError
from .epilogue import Epilogue

FLOAT_DTYPES = ("float32", "float16", "bfloat16")
INT_DTYPES = ("int8",)
DEFAULT_ACC = {"float32": "float32", "float16": "float32", "bfloat16": "float32", "int8": "int32"}


@dataclass(frozen=True)
class Tensor:
    name: str
    shape: tuple[int, ...]
    dtype: str
    role: str  # "A", "B", "bias" (inputs) or "out"


@dataclass(frozen=True)
class Axis:
    name: str
    extent: int
    role: str  # "b" | "m" | "n" | "k"


@dataclass(frozen=True)
class Operator:
    name: str
    params: dict
    dtype: str
    acc_dtype: str
    epilogue: Epilogue
    inputs: tuple[Tensor, ...]
    output: Tensor
    axes: tuple[Axis, ...]  # the loops of block "C", in TE order
    macs: int
    _te: Callable = field(repr=False, compare=False)
    _ref: Callable = field(repr=False, compare=False)
    _tile: Callable = field(repr=False, compare=False)
    _pad: Callable = field(repr=False, compare=False)
    channel_axis: int = -1  # where a bias broadcasts in the output

    def __post_init__(self):
        self.epilogue.check(self.name, self.acc_dtype)

    # -- what schedules and back ends ask -------------------------------------------------
    @property
    def shape_str(self) -> str:
        return "x".join(str(v) for v in self.params["shape"])

    @property
    def out_dtype(self) -> str:
        return self.epilogue.out_dtype or self.acc_dtype

    def input(self, role: str) -> Tensor:
        for t in self.inputs:
            if t.role == role:
                return t
        raise KeyError(role)

    def axes_of(self, role: str) -> tuple[Axis, ...]:
        return tuple(a for a in self.axes if a.role == role)

    def prim_func(self, a_dtype: str | None = None, b_dtype: str | None = None):
        """The TE definition as a PrimFunc. `a_dtype="uint8"` for an int8 operator feeds an
        unsigned-A primitive: A+128 is staged as uint8 inside the kernel, and the function takes
        one more argument after the inputs, `comp` = -128 * sum(B over the reduction) per output
        channel (see `compensation`), added after the reduction: the result is exact.
        `a_dtype="int16"` stages A sign-extended; `b_dtype` is the dtype the function takes B in
        (the caller converts the weights, like packing)."""
        from tvm import te

        return te.create_prim_func(self._te(a_dtype, b_dtype))

    def footprint(self, operand: str, ext: dict[str, int], rows_used: bool = False) -> int:
        """Elements of operand "A", "B" or "C" touched by a tile of `ext` iterations per axis
        (`rows_used`: as `tile_shape`)."""
        # Memoized: the knob search asks for the same tiles thousands of times per operator.
        key = (operand, tuple(ext.items()), rows_used)
        memo = self.__dict__.setdefault("_footprints", {})
        if key not in memo:
            memo[key] = math.prod(t for _, t, _ in self._tile(operand, ext, rows_used))
        return memo[key]

    def tile_shape(self, operand: str, ext: dict[str, int],
                   rows_used: bool = False) -> tuple[tuple[str, int, int], ...]:
        """The tile of operand "A", "B" or "C" touched by `ext` iterations per axis, one
        (axis, tile extent, tensor extent) per dimension of the tensor, outer to inner. The
        axis is the operator axis that indexes the dimension (a window dim: its output axis).

        `rows_used`: the outer window dim of a strided window (conv2d's input rows) counts
        only the rows the kernel taps read, as a copy that takes rows at a pitch stores it
        (rows oh * stride + r * dilation: every stride-th row when the tile has one tap row,
        every gcd(stride, dilation)-th otherwise); the default is the whole span. A dim that
        this makes smaller than the span is a strided dim (`strided_dims`)."""
        return tuple(self._tile(operand, ext, rows_used))

    def strided_dims(self, operand: str, ext: dict[str, int]) -> tuple[int, ...]:
        """Dims of the `rows_used` tile that hold every g-th row of the span (g > 1)."""
        dense, used = self.tile_shape(operand, ext), self.tile_shape(operand, ext, True)
        return tuple(d for d, (a, b) in enumerate(zip(dense, used)) if b[1] < a[1])

    def padded(self, ext: dict[str, int]) -> "Operator":
        """The same operator with axes grown to `ext` (zero padding: results in the original
        region are unchanged). See `pad_inputs` and `crop_output`."""
        return self if all(ext[a.name] == a.extent for a in self.axes) else self._pad(ext)

    def pad_inputs(self, big: "Operator", arrays) -> list[np.ndarray]:
        """Zero-pad inputs of this operator to the shapes of its padded form `big`."""
        out = []
        for t, tb, x in zip(self.inputs, big.inputs, arrays):
            if t.shape != tb.shape:
                x = np.pad(x, [(0, b - a) for a, b in zip(t.shape, tb.shape)])
            out.append(x)
        return out

    def crop_output(self, y: np.ndarray) -> np.ndarray:
        if y.shape == self.output.shape:
            return y
        return np.ascontiguousarray(y[tuple(slice(0, n) for n in self.output.shape)])

    def compensation(self, b: np.ndarray) -> np.ndarray:
        """-128 * sum of the weights over the reduction axes, per output channel (int32): what
        turns sum((a + 128) * w) back into sum(a * w). Computed once per weight array, like
        packing."""
        w = b.astype(np.int64)
        if self.name == "conv2d":
            axes = (1, 2, 3) if self.params["layout"] == "NCHW" else (0, 1, 2)
        else:
            axes = (-1,) if self.params["transpose_b"] else (-2,)
        return (-128 * w.sum(axis=axes)).astype(np.int32)

    def reference(self, *arrays: np.ndarray) -> np.ndarray:
        """The NumPy result for inputs in the order of `self.inputs`."""
        return self._ref(*arrays)

    def random_inputs(self, seed: int = 0) -> list[np.ndarray]:
        """Random, non-zero inputs covering the dtype's range (int8: all of [-128, 127])."""
        rng = np.random.default_rng(seed)
        out = []
        for t in self.inputs:
            if t.dtype == "int8":
                x = rng.integers(-128, 128, size=t.shape, dtype=np.int8)
            elif t.dtype == "int32":
                x = rng.integers(-(1 << 12), 1 << 12, size=t.shape, dtype=np.int32)
            else:
                x = rng.uniform(-1, 1, size=t.shape).astype(np_dtype(t.dtype))
            out.append(x)
        return out

    def tolerance(self) -> float:
        """Relative tolerance a verified result must meet (0 for exact integer results)."""
        return {"float32": 1e-4, "float16": 1e-2, "bfloat16": 1e-2}.get(self.dtype, 0.0)

    def check(self, got: np.ndarray, want: np.ndarray) -> tuple[bool, float]:
        """(ok, error): max abs difference for integers, relative Frobenius error for floats."""
        if got.shape != want.shape:
            return False, float("inf")
        if self.tolerance() == 0.0:
            err = float(np.max(np.abs(got.astype(np.int64) - want.astype(np.int64)), initial=0))
            return err == 0, err
        g, w = got.astype(np.float64), want.astype(np.float64)
        err = float(np.linalg.norm(g - w) / max(np.linalg.norm(w), 1e-30))
        return err <= self.tolerance(), err

    def __str__(self) -> str:
        ep = "+".join(s.kind for s in self.epilogue.steps)
        return f"{self.name}({self.shape_str}, {self.dtype}{', ' + ep if ep else ''})"


def np_dtype(dtype: str):
    if dtype == "bfloat16":
        import ml_dtypes

        return ml_dtypes.bfloat16
    return np.dtype(dtype)


def check_dtypes(opname: str, dtype: str, acc_dtype: str | None) -> str:
    if dtype not in FLOAT_DTYPES + INT_DTYPES:
        raise ScheduleError(f"{opname}(dtype={dtype!r}): supported dtypes are "
                            f"{list(FLOAT_DTYPES + INT_DTYPES)}")
    acc = acc_dtype or DEFAULT_ACC[dtype]
    if (dtype in INT_DTYPES) != (acc == "int32") or acc not in ("float32", "int32"):
        raise ScheduleError(f"{opname}(dtype={dtype!r}, acc_dtype={acc!r}): int8 accumulates "
                            f"in int32, floating types in float32")
    return acc


def check_dims(opname: str, **dims: int) -> None:
    for k, v in dims.items():
        if not isinstance(v, (int, np.integer)) or isinstance(v, bool) or v <= 0:
            raise ScheduleError(f"{opname}({k}={v!r}): must be a positive integer")


def acc_numpy(dtype: str, acc: str, *arrays: np.ndarray) -> list[np.ndarray]:
    """Inputs widened the way the accumulator sees them (bf16 rounds first, then f32)."""
    if acc == "int32":
        return [a.astype(np.int64) for a in arrays]
    return [a.astype(np.float32).astype(np.float64) for a in arrays]


def finish(op_acc: np.ndarray, acc: str) -> np.ndarray:
    """Bring a float64/int64 NumPy accumulation to the accumulator dtype (int32 wraps)."""
    if acc == "int32":
        return op_acc.astype(np.int64).astype(np.int32)
    return op_acc.astype(np.float32)
