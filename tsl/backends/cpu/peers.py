"""The CPU rows' peers, timed in a worker process: NumPy/OpenBLAS and, when importable, PyTorch.

A worker process because OpenBLAS reads OPENBLAS_CORETYPE / OPENBLAS_L2_SIZE when it loads: some
hosts set them to work around old OpenBLAS bugs, and they slow a current one down, so the
worker starts without them. It reports which kernel OpenBLAS chose (threadpoolctl) and times
on request, so that tsl's kernel and its peers can be timed alternately in one run.

Peers per operator: NumPy's float32 matmul of the same GEMM shape (conv2d: its im2col GEMM, the
im2col not counted); PyTorch CPU's F.conv2d (oneDNN) for conv2d, F.linear (+ bias, relu) for
dense and matmul, and fbgemm's quantized linear for int8 GEMMs (it saturates int16 partial sums
on full-range inputs: a speed reference, not an exactness one).
"""

from __future__ import annotations

import atexit
import functools
import json
import os
import subprocess
import sys
import time

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


class Peers:
    """A worker process timing the peers of operators (see `spec`)."""

    def __init__(self):
        env = {k: v for k, v in os.environ.items() if k not in UNSET}
        self.unset = [k for k in UNSET if k in os.environ]
        self.proc = subprocess.Popen([sys.executable, "-m", __name__], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True, env=env)
        self.info = self._ask({"cmd": "info"})

    def _ask(self, msg: dict) -> dict:
        self.proc.stdin.write(json.dumps(msg) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError("the peer worker process ended")
        return json.loads(line)

    def time(self, op) -> dict:
        """{peer name: ops per second} for `op`, one measurement each."""
        return self._ask({"cmd": "time", "op": spec(op), "macs": op.macs})

    def blas(self) -> str:
        b = self.info.get("blas") or "unknown BLAS"
        return b + (f", {'/'.join(self.unset)} unset" if self.unset else "")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.stdin.close()
            self.proc.wait(timeout=10)


@functools.cache
def shared() -> Peers:
    """One worker for the whole process (closed at exit)."""
    p = Peers()
    atexit.register(p.close)
    return p


# -- the worker ------------------------------------------------------------------------------
def _median_seconds(f, repeat: int = 7) -> float:
    import numpy as np

    from ...timing import realtime

    f()
    ts = []
    with realtime():
        for _ in range(repeat):
            t = time.perf_counter()
            f()
            ts.append(time.perf_counter() - t)
    return float(np.median(ts))


def _info() -> dict:
    out = {"blas": None, "torch": None}
    try:
        from threadpoolctl import threadpool_info

        for lib in threadpool_info():
            if lib.get("user_api") == "blas":
                out["blas"] = (f"{lib.get('internal_api')} {lib.get('version')} kernel "
                               f"{lib.get('architecture')}, {lib.get('num_threads')} threads")
                break
    except ImportError:
        pass
    try:
        import torch

        out["torch"] = f"torch {torch.__version__}, {torch.get_num_threads()} threads"
    except ImportError:
        pass
    return out


def _numpy_rate(sp: dict, macs: int) -> float:
    import numpy as np

    b, m, n, k = sp["gemm"]
    rng = np.random.default_rng(0)
    a = rng.standard_normal((b, m, k), dtype=np.float32)
    w = rng.standard_normal((b, k, n), dtype=np.float32)
    return 2 * macs / _median_seconds(lambda: np.matmul(a, w))


def _torch_rates(sp: dict, macs: int) -> dict:
    import warnings

    warnings.filterwarnings("ignore", category=UserWarning)
    try:
        import torch
        import torch.nn.functional as F
    except ImportError:
        return {}
    out = {}
    with torch.no_grad():
        if sp["kind"] == "conv2d" and sp["dtype"] == "float32":
            n, c, h, w, k, r, s = sp["conv"]
            x, wt = torch.randn(n, c, h, w), torch.randn(k, c, r, s)
            st, pd, dl = sp["stride"], sp["padding"], sp["dilation"]
            out["torch conv2d f32"] = 2 * macs / _median_seconds(
                lambda: F.conv2d(x, wt, stride=st, padding=pd, dilation=dl))
        elif sp["kind"] in ("dense", "matmul") and sp["gemm"][0] == 1:
            _, m, n, k = sp["gemm"]
            if sp["dtype"] == "int8":
                try:
                    wq = torch.quantize_per_tensor(torch.randn(n, k), 0.05, 0, torch.qint8)
                    packed = torch.ops.quantized.linear_prepack(wq, None)
                    xq = torch.quantize_per_tensor(torch.rand(m, k), 0.05, 0, torch.quint8)
                    out["torch int8 linear (fbgemm)"] = 2 * macs / _median_seconds(
                        lambda: torch.ops.quantized.linear(xq, packed, 1.0, 0))
                except (RuntimeError, AttributeError):
                    pass
            else:
                x, wt = torch.randn(m, k), torch.randn(n, k)
                bias = torch.randn(n) if sp.get("bias") else None

                def lin():
                    y = F.linear(x, wt, bias)
                    return F.relu(y) if sp.get("relu") else y
                out["torch linear f32"] = 2 * macs / _median_seconds(lin)
    return out


def _serve() -> None:
    for line in sys.stdin:
        msg = json.loads(line)
        if msg["cmd"] == "info":
            reply = _info()
        else:
            sp, macs = msg["op"], msg["macs"]
            name = "numpy im2col-gemm f32" if sp["kind"] == "conv2d" else "numpy f32"
            reply = {name: _numpy_rate(sp, macs), **_torch_rates(sp, macs)}
        print(json.dumps(reply), flush=True)


if __name__ == "__main__":
    _serve()
