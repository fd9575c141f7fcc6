"""Element-wise epilogues applied to the accumulator before it leaves the chip.

An epilogue is a tuple of steps applied in the order they are composed: `relu() + bias()` is
max(acc, 0) + bias, `bias() + relu()` is max(acc + bias, 0). Each step knows its NumPy meaning
and its TE expression; every back end runs the steps in that order (the ones lowering the TE
definition get it from there, VTA maps each step onto its ALU in turn), or refuses the
composition with a ScheduleError.

Three steps read an operand, an extra input of the operator after A and B, in step order:
`bias()` and `scale()` a vector of the output channels (in the accumulator dtype; a batch norm
that cannot be folded into the weights is `scale() + bias()`), `residual()` a tensor of the
output's shape and dtype (a skip connection added before the activation, as ResNets do).
Operands of a kind that repeats are named "bias", "bias2", ... (`Epilogue.operands`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ScheduleError


@dataclass(frozen=True)
class Step:
    kind: str  # "bias" | "scale" | "residual" | "relu" | "gelu" | "silu" | "shift" | "clip"
    value: tuple = ()

    @property
    def operand(self) -> str | None:
        """The kind of extra input the step reads: "channel" (one value per output channel),
        "output" (the output's shape) or None."""
        return {"bias": "channel", "scale": "channel", "residual": "output"}.get(self.kind)

    def __add__(self, other) -> "Epilogue":
        return Epilogue((self,)) + other


@dataclass(frozen=True)
class Epilogue:
    steps: tuple[Step, ...]
    out_dtype: str | None = None  # None: the accumulator dtype

    def __add__(self, other) -> "Epilogue":
        other = as_epilogue(other)
        if self.out_dtype and other.steps:
            raise ScheduleError("an epilogue that narrows to "
                                f"{self.out_dtype} (requantize) must come last")
        return Epilogue(self.steps + other.steps, other.out_dtype or self.out_dtype)

    def check(self, opname: str, acc_dtype: str) -> "Epilogue":
        """Refuse steps that the accumulator dtype cannot take (an arithmetic shift or an int8
        result of a floating-point accumulator, clip bounds outside an int32 accumulator)."""
        is_int = acc_dtype.startswith("int")
        for s in self.steps:
            if s.kind in FLOAT_ONLY and is_int:
                raise ScheduleError(f"{opname}: {s.kind}() needs a floating-point accumulator, "
                                    f"but this operator accumulates in {acc_dtype}")
            if s.kind == "shift" and not is_int:
                raise ScheduleError(f"{opname}: shift({s.value[0]}) needs an integer "
                                    f"accumulator, but this operator accumulates in {acc_dtype}; "
                                    "drop the shift / requantize step or use dtype='int8'")
            if s.kind == "clip" and is_int:
                info = np.iinfo(acc_dtype)
                if not all(isinstance(v, (int, np.integer)) for v in s.value) or not (
                        info.min <= s.value[0] <= s.value[1] <= info.max):
                    raise ScheduleError(f"{opname}: clip{s.value} on a {acc_dtype} accumulator "
                                        f"needs integers {info.min} <= lo <= hi <= {info.max}")
        if self.out_dtype and is_int != self.out_dtype.startswith("int"):
            raise ScheduleError(f"{opname}: the epilogue's result dtype {self.out_dtype} does not "
                                f"match the {acc_dtype} accumulator")
        return self

    def require(self, kinds: tuple[str, ...], where: str) -> "Epilogue":
        """Refuse (ScheduleError) steps outside `kinds`, or an operand kind that repeats, for a
        back end (`where`) whose kernels run only those steps."""
        bad = [s.kind for s in self.steps if s.kind not in kinds]
        op_kinds = [s.kind for _, s in self.operands]
        if bad or len(set(op_kinds)) < len(op_kinds):
            what = f"steps {bad}" if bad else f"a repeated operand step {op_kinds}"
            raise ScheduleError(f"{where} runs the epilogue steps {list(kinds)}, each operand step "
                                f"once; {what} are not among them: fold them into one step or "
                                f"build for the CPU or Tensor Core back end")
        return self

    @property
    def has_bias(self) -> bool:
        return any(s.kind == "bias" for s in self.steps)

    @property
    def operands(self) -> tuple[tuple[str, Step], ...]:
        """(input name, step) of every step that reads an operand, in step order."""
        seen: dict[str, int] = {}
        out = []
        for s in self.steps:
            if s.operand:
                seen[s.kind] = seen.get(s.kind, 0) + 1
                out.append((s.kind if seen[s.kind] == 1 else f"{s.kind}{seen[s.kind]}", s))
        return tuple(out)

    def operand_tensors(self, channels: int, out_shape: tuple, acc_dtype: str):
        """(name, shape, dtype) of each operand input: channel vectors in the accumulator
        dtype, residuals in the output's shape and dtype."""
        return tuple((name, (channels,), acc_dtype) if s.operand == "channel"
                     else (name, tuple(out_shape), self.out_dtype or acc_dtype)
                     for name, s in self.operands)

    def numpy(self, acc: np.ndarray, operands: dict, channel_axis: int) -> np.ndarray:
        """Apply to an accumulator array; `operands` maps each operand's name (`operands`) to
        its array: channel vectors broadcast along `channel_axis`."""
        x = acc
        names = iter(name for name, _ in self.operands)
        for s in self.steps:
            if s.operand:
                v = np.asarray(operands[next(names)])
                if s.operand == "channel":
                    shape = [1] * acc.ndim
                    shape[channel_axis] = -1
                    v = v.reshape(shape)
                v = v.astype(x.dtype)
                x = x * v if s.kind == "scale" else x + v
            elif s.kind == "relu":
                x = np.maximum(x, np.zeros((), x.dtype))
            elif s.kind == "gelu":
                from scipy.special import erf

                x = (0.5 * x * (1.0 + erf(x.astype(np.float64) / np.sqrt(2.0)))).astype(x.dtype)
            elif s.kind == "silu":
                x = (x / (1.0 + np.exp(-x.astype(np.float64)))).astype(x.dtype)
            elif s.kind == "shift":
                x = x >> s.value[0] if s.value[0] >= 0 else x << -s.value[0]
            elif s.kind == "clip":
                x = np.clip(x, s.value[0], s.value[1]).astype(x.dtype)
        return x.astype(self.out_dtype) if self.out_dtype else x

    def te(self, value, operand_values: dict, acc_dtype: str):
        """The TE expression of the steps applied to `value` (a PrimExpr of `acc_dtype`);
        `operand_values` maps each operand's name to its value at this output element."""
        from tvm import tirx

        x = value
        names = iter(name for name, _ in self.operands)
        for s in self.steps:
            if s.operand:
                v = operand_values[next(names)].astype(acc_dtype)
                x = x * v if s.kind == "scale" else x + v
            elif s.kind == "relu":
                x = tirx.max(x, tirx.const(0, acc_dtype))
            elif s.kind == "gelu":
                half = tirx.const(0.5, acc_dtype)
                x = half * x * (tirx.const(1.0, acc_dtype)
                                + tirx.erf(x * tirx.const(0.7071067811865476, acc_dtype)))
            elif s.kind == "silu":
                x = x * tirx.sigmoid(x)
            elif s.kind == "shift":
                sh = s.value[0]
                x = (tirx.shift_right(x, tirx.const(sh, acc_dtype)) if sh >= 0
                     else tirx.shift_left(x, tirx.const(-sh, acc_dtype)))
            elif s.kind == "clip":
                x = tirx.min(tirx.max(x, tirx.const(s.value[0], acc_dtype)),
                             tirx.const(s.value[1], acc_dtype))
        return x.astype(self.out_dtype) if self.out_dtype else x


# Steps only a floating-point accumulator takes.
FLOAT_ONLY = ("gelu", "silu", "scale")


def as_epilogue(e) -> Epilogue:
    if e is None:
        return Epilogue(())
    if isinstance(e, Epilogue):
        return e
    if isinstance(e, Step):
        return Epilogue((e,))
    if isinstance(e, (list, tuple)):
        out = Epilogue(())
        for x in e:
            out = out + x
        return out
    raise ScheduleError(f"epilogue must be tsl.ops.bias(), scale(), residual(), relu(), gelu(), "
                        f"silu(), clip(...), shift(...), requantize(...) or a sum of them; "
                        f"got {e!r}")


def bias() -> Step:
    """Add a per-output-channel bias (an extra input of the operator)."""
    return Step("bias")


def scale() -> Step:
    """Multiply by a per-output-channel scale (an extra input of the operator): with `bias()`
    after it, a batch norm that is not folded into the weights."""
    return Step("scale")


def residual() -> Step:
    """Add a tensor of the output's shape and dtype (an extra input of the operator): the skip
    connection of a residual block, fused where the output is written."""
    return Step("residual")


def relu() -> Step:
    return Step("relu")


def gelu() -> Step:
    """x * Phi(x) with the exact (erf) Gaussian CDF, as torch.nn.GELU() and ONNX Gelu."""
    return Step("gelu")


def silu() -> Step:
    """x * sigmoid(x) (SiLU / swish)."""
    return Step("silu")


def shift(amount: int) -> Step:
    """Arithmetic shift right of an integer accumulator by `amount` (a negative amount shifts
    left, wrapping in int32). `shift(8) + bias()` shifts before adding the bias, as VTA's classic
    post-processing does; `requantize(..., bias=True)` adds it first."""
    if not isinstance(amount, (int, np.integer)) or isinstance(amount, bool) \
            or not -31 <= amount <= 31:
        raise ScheduleError(f"shift({amount!r}): the amount must be an int in [-31, 31]")
    return Step("shift", (int(amount),))


def clip(lo, hi) -> Step:
    """Clamp every value to [lo, hi] (min(max(x, lo), hi)); the accumulator dtype is kept."""
    for v in (lo, hi):
        if isinstance(v, bool) or not isinstance(v, (int, float, np.integer, np.floating)):
            raise ScheduleError(f"clip({lo!r}, {hi!r}): bounds must be numbers")
    if not lo <= hi:
        raise ScheduleError(f"clip({lo!r}, {hi!r}): needs lo <= hi")
    return Step("clip", (lo, hi))


def requantize(shift: int, bias: bool = False, clip: tuple[int, int] = (-128, 127),
               out_dtype: str = "int8") -> Epilogue:
    """int32 accumulator -> (+ bias) -> arithmetic shift right by `shift` -> clip -> int8.

    The order (bias before shift) is the one VTA's ALU runs in place in the accumulator."""
    if not isinstance(shift, int) or not -31 <= shift <= 31:
        raise ScheduleError(f"requantize(shift={shift!r}): shift must be an int in [-31, 31]")
    lo, hi = clip
    info = np.iinfo(out_dtype)
    if not (info.min <= lo <= hi <= info.max):
        raise ScheduleError(f"requantize(clip={clip!r}): need {info.min} <= lo <= hi <= "
                            f"{info.max} for {out_dtype}")
    steps = ((Step("bias"),) if bias else ()) + (Step("shift", (shift,)), Step("clip", (lo, hi)))
    return Epilogue(steps, out_dtype)
