"""A `Plan` as a Pallas TPU kernel: `pallas_call` with the plan's grid, BlockSpecs, VMEM scratch,
dimension semantics and VMEM limit, inside a jitted function that does the plan's passes (pad,
layout, crop) around it.

The same kernel body runs three ways: lowered for platform "tpu" (Pallas -> Mosaic: a
`tpu_custom_call` in StableHLO, what a TPU runs; no TPU needed to lower or export it), and in
Pallas interpret mode on XLA:CPU for numerics here (`interpret=True`; its timing says nothing
about a TPU). `export` serializes both with `jax.export`.
"""

from __future__ import annotations

import base64
import functools
import json
import re

from ...errors import BackendUnavailable, LoweringError
from .plan import Plan

INSTALL_HINT = 'pip install -e ".[tpu]" (or pip install "jax[cpu]" flatbuffers)'


def _modules():
    try:
        import jax
        import jax.numpy as jnp
        from jax import lax
        from jax.experimental import pallas as pl
        from jax.experimental.pallas import tpu as pltpu
    except ImportError as e:
        raise BackendUnavailable(f"the Mosaic (Pallas TPU) kernel needs jax, which cannot be "
                                 f"imported here ({e}); install it with {INSTALL_HINT}") from None
    return jax, jnp, lax, pl, pltpu


def _jnp_dtype(jnp, dtype: str):
    return {"bfloat16": jnp.bfloat16, "float32": jnp.float32, "int8": jnp.int8,
            "int32": jnp.int32, "float16": jnp.float16}[dtype]


def _epilogue(jnp, lax, steps, x, bias):
    for s in steps:
        if s.kind == "bias":
            x = x + bias.astype(x.dtype)
        elif s.kind == "relu":
            x = jnp.maximum(x, jnp.zeros((), x.dtype))
        elif s.kind == "shift":
            sh = s.value[0]
            x = lax.shift_right_arithmetic(x, jnp.full(x.shape, sh, x.dtype)) if sh >= 0 else \
                lax.shift_left(x, jnp.full(x.shape, -sh, x.dtype))
        elif s.kind == "clip":
            x = jnp.clip(x, s.value[0], s.value[1])
        else:
            raise LoweringError(f"the Mosaic kernel has no epilogue step {s.kind!r}")
    return x


def _window(jnp, lax, pl, cv: dict, x_ref):
    """The block's input window, with the convolution's zero padding (and rows past the
    image, for an edge block) masked to zero: the pipeline leaves them undefined."""
    x = x_ref[0]
    if not cv["masked"]:
        return x
    rows_axis = 2  # grid (co, n, rows, ci)
    r0 = pl.program_id(rows_axis) * (cv["th"] * cv["stride"]) - cv["pad"]
    hh = lax.broadcasted_iota(jnp.int32, x.shape, 0) + r0
    ww = lax.broadcasted_iota(jnp.int32, x.shape, 1) - cv["pad"]
    ok = (hh >= 0) & (hh < cv["H"]) & (ww >= 0) & (ww < cv["W"])
    return jnp.where(ok, x, jnp.zeros((), x.dtype))


def _im2col(jnp, lax, pl, cv: dict, x_ref, col_ref):
    """The (rows, R*S*ci) tile of the block's output rows, in VMEM."""
    th, Q, ci = cv["th"], cv["Q"], cv["ci"]
    st, dl = cv["stride"], cv["dil"]
    rows = th * Q
    x = _window(jnp, lax, pl, cv, x_ref)
    if col_ref.shape[0] > rows:
        col_ref[rows:, :] = jnp.zeros((col_ref.shape[0] - rows, col_ref.shape[1]),
                                      col_ref.dtype)
    for r in range(cv["R"]):
        for s in range(cv["S"]):
            win = lax.slice(x, (r * dl, s * dl, 0),
                            (r * dl + (th - 1) * st + 1, s * dl + (Q - 1) * st + 1, ci),
                            (st, st, 1))
            t = r * cv["S"] + s
            col_ref[:rows, t * ci:(t + 1) * ci] = win.reshape(rows, ci)
    return col_ref[...]


def _body(plan: Plan):
    """The kernel function: zero the accumulator on the first reduction step, one MXU dot per
    step (for conv2d on the im2col tile it first builds in VMEM), the epilogue on the last."""
    jax, jnp, lax, pl, pltpu = _modules()
    n_in = len(plan.inputs)
    red = plan.reduction_axes
    ext = [a.extent for a in plan.grid]
    acc_dt = _jnp_dtype(jnp, plan.acc_dtype)
    out_dt = _jnp_dtype(jnp, plan.out_dtype)
    steps = plan.epilogue.steps if plan.epilogue is not None else ()
    cv = plan.conv

    def kernel(*refs):
        ins, o_ref, acc_ref = refs[:n_in], refs[n_in], refs[n_in + 1]
        if plan.kind == "conv":
            lhs = _im2col(jnp, lax, pl, cv, ins[0], refs[n_in + 2])
            w = ins[1][...]
            rhs = w.reshape(w.shape[0] * w.shape[1], w.shape[2])
        else:
            lhs, rhs = ins[0][...], ins[1][...]
        prod = lax.dot_general(lhs, rhs, plan.dims, preferred_element_type=acc_dt)
        bias = ins[2][...] if len(ins) > 2 else None

        def finish():
            y = _epilogue(jnp, lax, steps, acc_ref[...], bias).astype(out_dt)
            if plan.kind == "conv":  # the block's th x OW output pixels
                y = y[:cv["rows"]].reshape(o_ref.shape)
            o_ref[...] = y

        if not red:
            acc_ref[...] = prod
            finish()
            return
        first = functools.reduce(lambda a, b: a & b, [pl.program_id(i) == 0 for i in red])
        last = functools.reduce(lambda a, b: a & b,
                                [pl.program_id(i) == ext[i] - 1 for i in red])

        @pl.when(first)
        def _():
            acc_ref[...] = jnp.zeros(acc_ref.shape, acc_dt)

        acc_ref[...] += prod
        pl.when(last)(finish)

    return kernel


def pallas_call(plan: Plan, vmem_limit: int, interpret: bool):
    """The plan's `pallas_call` (a function of the kernel's arrays)."""
    jax, jnp, lax, pl, pltpu = _modules()

    def spec(b):
        shape = tuple(pl.Element(d, b.pad[i] if b.pad else (0, 0)) if i in b.window else d
                      for i, d in enumerate(b.block))
        return pl.BlockSpec(shape, b.index)

    scratch = [pltpu.VMEM(plan.acc_shape, _jnp_dtype(jnp, plan.acc_dtype))]
    if plan.kind == "conv":
        scratch.append(pltpu.VMEM(plan.dot[:2], _jnp_dtype(jnp, plan.inputs[0].dtype)))
    return pl.pallas_call(
        _body(plan),
        out_shape=jax.ShapeDtypeStruct(plan.out.shape, _jnp_dtype(jnp, plan.out.dtype)),
        grid=tuple(a.extent for a in plan.grid),
        in_specs=[spec(b) for b in plan.inputs], out_specs=spec(plan.out),
        scratch_shapes=scratch,
        compiler_params=pltpu.CompilerParams(
            dimension_semantics=tuple(a.semantics for a in plan.grid),
            vmem_limit_bytes=int(vmem_limit)),
        interpret=interpret, name=f"tsl_{plan.kind}")


def program(plan: Plan, op, big, vmem_limit: int, interpret: bool):
    """A jax function of the user's arrays: the passes, the kernel, the crop."""
    jax, jnp, lax, pl, pltpu = _modules()
    call = pallas_call(plan, vmem_limit, interpret)
    if plan.kind == "conv":
        return functools.partial(_conv_program, jnp, lax, plan, op, call)

    def f(*xs):
        ks = []
        for t, tb, x in zip(op.inputs, big.inputs, xs):
            if t.shape != tb.shape:
                x = jnp.pad(x, [(0, b - a) for a, b in zip(t.shape, tb.shape)])
            if t.role == "bias":
                x = x.reshape(1, -1)
            ks.append(x)
        y = call(*ks)
        if y.shape != op.output.shape:
            y = y[tuple(slice(0, n) for n in op.output.shape)]
        return y
    return f


def _conv_program(jnp, lax, plan, op, call, x, w, *rest):
    """The kernel on the operator's own arrays: NHWC in and out, weights RSCK seen as
    (R*S, C, K) (a free reshape); NCHW through layout transposes."""
    c = plan.conv
    if c["layout"] == "NCHW":
        x = jnp.transpose(x, (0, 2, 3, 1))
        w = jnp.transpose(w, (2, 3, 1, 0))
    ks = [x, w.reshape(c["R"] * c["S"], c["C"], c["K"])]
    if rest:
        ks.append(rest[0].reshape(1, -1))
    y = call(*ks)
    if c["layout"] == "NCHW":
        y = jnp.transpose(y, (0, 3, 1, 2))
    return y


def _specs(jnp, op):
    import jax

    return [jax.ShapeDtypeStruct(t.shape, _jnp_dtype(jnp, t.dtype)) for t in op.inputs]


def exported(fn, op, platform: str):
    """`jax.export.Exported` of `fn` (a function of the user's arrays) for `platform`."""
    jax, jnp, *_ = _modules()
    try:
        return jax.export.export(jax.jit(fn), platforms=[platform])(*_specs(jnp, op))
    except BackendUnavailable:
        raise
    except Exception as e:  # noqa: BLE001 - Pallas/Mosaic raise many kinds of errors
        raise LoweringError(f"lowering the Mosaic kernel of {op} for {platform} failed: "
                            f"{str(e).strip().splitlines()[0][:400]}") from e


def serialize(exp) -> bytes:
    try:
        return bytes(exp.serialize())
    except ImportError as e:
        raise BackendUnavailable(f"serializing a jax.export needs flatbuffers ({e}); install "
                                 f"it with {INSTALL_HINT}") from None


def mosaic_text(stablehlo: str) -> str:
    """The Mosaic kernels inside a StableHLO module's tpu_custom_calls, decoded to MLIR text
    (grid = iteration_bounds, blocks = window_bounds, VMEM memrefs, dimension_semantics)."""
    from jax._src.interpreters import mlir as jmlir
    from jax._src.lib import tpu
    from jaxlib.mlir import ir

    out = []
    for cfg in re.findall(r'@tpu_custom_call\(.*?backend_config = "(.*?)"', stablehlo):
        cfg = json.loads(re.sub(r"\\([0-9A-Fa-f]{2})", lambda m: chr(int(m.group(1), 16)), cfg))
        body = base64.b64decode(cfg["custom_call_config"]["body"])
        ctx = jmlir.make_ir_context()
        tpu.register_dialect(ctx)
        ctx.allow_unregistered_dialects = True
        out.append(str(ir.Module.parse(body, context=ctx)))
    if not out:
        raise LoweringError("the exported module has no tpu_custom_call")
    return "\n".join(out)
