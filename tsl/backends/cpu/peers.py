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
on full-range inputs: a speed reference, not an exactness one); ONNX Runtime's MatMul (+ Add,
Relu) for float32 dense, matmul and batch_matmul, from a model whose rows are a dynamic axis.
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
            "bias": ep.has_bias, "relu": any(st.kind == "relu" for st in ep.steps),
            "transpose_b": bool(p.get("transpose_b"))}


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
    if sp["kind"] in ("dense", "matmul", "batch_matmul") and sp["dtype"] == "float32":
        out["onnxruntime f32"] = f"{mod}:onnxruntime_gemm"
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


def onnxruntime_gemm(sp: dict):
    """ONNX Runtime's CPU session of a model of the operator: MatMul (+ Add of the bias, Relu)
    whose rows are a dynamic axis, as in a model exported with a dynamic sequence length or
    batch (ORT takes the shape at run time); a dense operator's weights are initializers
    (constants, as tsl's bound weights), a matmul's both operands inputs, B as N x K where the
    operator transposes it (ORT's optimizer folds the Transpose into its MatMul), its columns a
    dynamic axis too. Its intra-op threads are the process's cores (OMP_NUM_THREADS, set by
    `tsl.bench.alone`)."""
    import os

    import numpy as np
    try:
        import onnxruntime as ort
        from onnx import TensorProto, helper, numpy_helper
    except ImportError:
        return None
    b, m, n, k = sp["gemm"]
    lead = [b] if sp["kind"] == "batch_matmul" else []
    rng = np.random.default_rng(0)
    x = rng.standard_normal((*lead, m, k), dtype=np.float32)
    w = rng.standard_normal((*lead, k, n), dtype=np.float32)
    inputs = [helper.make_tensor_value_info("x", TensorProto.FLOAT, [*lead, "m", k])]
    inits, feeds, nodes, wname = [], {"x": x}, [], "w"
    if sp["kind"] == "dense":
        inits.append(numpy_helper.from_array(w, "w"))
    elif sp.get("transpose_b"):  # B given as the operator takes it, N x K (attention's K)
        wt = np.ascontiguousarray(np.swapaxes(w, -1, -2))
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [*lead, "n", k]))
        feeds["w"], wname = wt, "wt"
        nodes.append(helper.make_node("Transpose", ["w"], ["wt"],
                                      perm=[*range(len(lead)), len(lead) + 1, len(lead)]))
    else:
        inputs.append(helper.make_tensor_value_info("w", TensorProto.FLOAT, [*lead, k, "n"]))
        feeds["w"] = w
    nodes.append(helper.make_node("MatMul", ["x", wname], ["mm"]))
    last = "mm"
    if sp.get("bias"):
        inits.append(numpy_helper.from_array(rng.standard_normal(n, dtype=np.float32), "b"))
        nodes.append(helper.make_node("Add", [last, "b"], ["biased"]))
        last = "biased"
    if sp.get("relu"):
        nodes.append(helper.make_node("Relu", [last], ["relu"]))
        last = "relu"
    graph = helper.make_graph(nodes, "peer", inputs,
                              [helper.make_tensor_value_info(last, TensorProto.FLOAT, None)],
                              initializer=inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], ir_version=8)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = int(os.environ.get("OMP_NUM_THREADS", "0"))
    sess = ort.InferenceSession(model.SerializeToString(), opts,
                                providers=["CPUExecutionProvider"])
    return lambda: sess.run(None, feeds)
