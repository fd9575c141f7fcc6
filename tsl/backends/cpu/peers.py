"""The CPU rows' peers: NumPy/OpenBLAS and, when importable, PyTorch, as peer makers.

A maker takes an operator's `spec` and returns the call to time (or None where the peer does
not apply or is not installed). This module only says what each peer runs; timing each one
alone, in a fresh process with nothing else running, is `tsl.bench.alone`'s (`python -m
tsl.bench.alone`): timed in the same process as tsl's kernel, or right after another peer,
their rates fell up to 80x behind what the same calls give alone, because the other party's
worker threads (TVM's pool, OpenBLAS) still spin on the two cores.

Peers per operator: NumPy's float32 matmul of the same GEMM shape (conv2d: its im2col GEMM, the
im2col not counted); PyTorch CPU's F.conv2d (oneDNN) for conv2d, F.linear (+ bias, relu) for
dense and matmul, and fbgemm's quantized linear for int8 GEMMs (it saturates int16 partial sums
on full-range inputs: a speed reference, not an exactness one).
"""

from __future__ import annotations

# OpenBLAS reads these when it loads: some hosts set them to work around old OpenBLAS bugs,
# and they slow a current one down, so peer processes start without them.
UNSET = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def spec(op) -> dict:
    """What the worker needs to know of an operator to time its peers."""
    p = op.params
    if op.name == "conv2d":
        n, c, h, w, k, r, s = p["shape"]
        out = op.output.shape
        pix = out[0] * (out[2] * out[3] if p["layout"] == "NCHW" else out[1] * out[2])
        return {"kind": "conv2d", "gemm": [1, pix, k, c * r * s], "conv": [n, c, h, w, k, r, s],
                "stride": p["stride"], "padding": p["padding"], "dilation": p["dilation"],
                "dtype": op.dtype}
    batch = p["shape"][0] if op.name == "batch_matmul" else 1
    m, n, k = p["shape"][-3:]
    ep = op.epilogue
    return {"kind": op.name, "gemm": [batch, m, n, k], "dtype": op.dtype,
            "bias": ep.has_bias, "relu": any(st.kind == "relu" for st in ep.steps)}


def makers(sp: dict) -> dict:
    """{peer name: "module:function" of its maker} for an operator's `spec`: the peers that
    apply to it (a maker may still find its library missing and return None)."""
    mod = __name__
    out = {("numpy im2col-gemm f32" if sp["kind"] == "conv2d" else "numpy f32"):
           f"{mod}:numpy_gemm"}
    if sp["kind"] == "conv2d" and sp["dtype"] == "float32":
        out["torch conv2d f32"] = f"{mod}:torch_conv2d"
    elif sp["kind"] in ("dense", "matmul") and sp["gemm"][0] == 1:
        out["torch int8 linear (fbgemm)" if sp["dtype"] == "int8" else "torch linear f32"] = \
            f"{mod}:torch_linear"
    return out


def blas_info() -> str | None:
    """Which kernel OpenBLAS chose and its threads (threadpoolctl), for the row's notes."""
    try:
        from threadpoolctl import threadpool_info
    except ImportError:
        return None
    for lib in threadpool_info():
        if lib.get("user_api") == "blas":
            return (f"{lib.get('internal_api')} {lib.get('version')} kernel "
                    f"{lib.get('architecture')}, {lib.get('num_threads')} threads")
    return None


def numpy_gemm(sp: dict):
    """NumPy's float32 matmul of the operator's GEMM shape (conv2d: its im2col GEMM, the
    im2col not counted)."""
    import numpy as np

    b, m, n, k = sp["gemm"]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((b, m, k), dtype=np.float32)
    w = rng.standard_normal((b, k, n), dtype=np.float32)
    return lambda: np.matmul(a, w)


def _torch():
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)
    try:
        import torch
    except ImportError:
        return None
    torch.set_grad_enabled(False)
    return torch


def torch_conv2d(sp: dict):
    """PyTorch CPU's F.conv2d (oneDNN) on the operator's NCHW shape."""
    torch = _torch()
    if torch is None:
        return None
    n, c, h, w, k, r, s = sp["conv"]
    x, wt = torch.randn(n, c, h, w), torch.randn(k, c, r, s)
    st, pd, dl = sp["stride"], sp["padding"], sp["dilation"]
    return lambda: torch.nn.functional.conv2d(x, wt, stride=st, padding=pd, dilation=dl)


def torch_linear(sp: dict):
    """F.linear (+ bias, relu) for float GEMMs; fbgemm's quantized linear for int8 ones (it
    saturates int16 partial sums on full-range inputs: a speed reference, not an exactness
    one)."""
    torch = _torch()
    if torch is None:
        return None
    _, m, n, k = sp["gemm"]
    if sp["dtype"] == "int8":
        try:
            wq = torch.quantize_per_tensor(torch.randn(n, k), 0.05, 0, torch.qint8)
            packed = torch.ops.quantized.linear_prepack(wq, None)
            xq = torch.quantize_per_tensor(torch.rand(m, k), 0.05, 0, torch.quint8)
        except (RuntimeError, AttributeError):
            return None
        return lambda: torch.ops.quantized.linear(xq, packed, 1.0, 0)
    F = torch.nn.functional
    x, wt = torch.randn(m, k), torch.randn(n, k)
    bias = torch.randn(n) if sp.get("bias") else None

    def lin():
        y = F.linear(x, wt, bias)
        return F.relu(y) if sp.get("relu") else y
    return lin
