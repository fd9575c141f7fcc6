import os

import pytest

import tsl
from tsl.backends.cpu import detect, host

# The suite runs on the built-in figures, so what the cost model picks does not depend on how
# busy the host was when it was probed; the probe's own tests turn it on with a tmp_path cache.
os.environ.setdefault("TSL_PROBE", "0")


@pytest.fixture(scope="session")
def cpu():
    """A CPU machine file for recording and lowering tests (nothing runs on it)."""
    return tsl.load_machine("x86-avx512")


@pytest.fixture(scope="session")
def suite_built():
    """`tsl.build(op, machine)` once per session, by (str(op), machine): the Tensor Core
    suite's sm_90 GEMMs are built, and compiled by nvcc (each artifact keeps its PTX and
    ptxas report), by both test_tensorcore_backend.py and test_tensorcore_sm90.py."""
    cache = {}

    def get(op, machine: str):
        key = (str(op), machine)
        if key not in cache:
            cache[key] = tsl.build(op, machine)
        return cache[key]
    return get


def cpu_machines() -> list[str]:
    """The CPU machines the CPU tests run on here: the detected one (or TSL_CPU's) and, when
    the host runs others, the baseline of its architecture (an AVX-512 host also checks the
    AVX2 code), so a regression in either is caught on any development machine."""
    chosen = detect()
    names = [chosen.name]
    if os.environ.get(host.ENV):
        return names
    runnable = host.runnable()
    baseline = min(runnable, key=lambda m: len(m.params.require))
    return names + ([baseline.name] if baseline.name != chosen.name else [])


def other_cpu_machines() -> list[str]:
    """Every other built-in CPU machine this host runs (smoke-tested only)."""
    return [m.name for m in host.runnable() if m.name not in cpu_machines()]


def cross_cpu_machines() -> list[str]:
    """Built-in CPU machines this host cannot run: cross-compiled, their assembly checked."""
    return [m.name for m in host.cpu_machines() if host.missing(m)]


def error_vs_torch(mod, model, x) -> float:
    """Relative error of `mod` compiled through tsl's CPU pipeline against `model(x)` in
    PyTorch (the check every imported-model test makes)."""
    import numpy as np
    import torch
    import tvm
    from tvm import relax

    import tsl

    ex = tvm.compile(mod, target=tsl.relax.tvm_target("cpu"),
                     relax_pipeline=tsl.relax.pipeline("cpu"),
                     tir_pipeline=tsl.relax.tir_pipeline("cpu"))
    out = relax.VirtualMachine(ex, tvm.cpu())["main"](tvm.runtime.tensor(x))
    got = (out if hasattr(out, "numpy") else out[0]).numpy()
    with torch.no_grad():
        want = model(torch.from_numpy(x)).numpy()
    return float(np.linalg.norm(got - want) / np.linalg.norm(want))
