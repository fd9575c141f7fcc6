"""Tutorial 5: tsl inside TVM's pipeline - a whole model, its GEMMs and convs on tsl's kernels.

A TVM user has a model as a Relax IRModule. `tsl.relax.pipeline(target)` is TVM's default
Relax pipeline with one pass added after operator fusion: each fused function that computes a
matmul / linear / batch matmul / conv2d (with the bias add, relu or requantize after it) is
recognized from its loops and blocks, built with tsl's schedule for the target's machine, and
swapped in. The rest of the model is TVM's, unchanged. `tsl.relax.report` says which calls tsl
took (schedule, knobs) and which it left to TVM, and why.

Run: python tutorials/05_relax.py          (a narrow ResNet-18, fp32 and int8: under a minute)
     python tutorials/05_relax.py --full   (ResNet-18 at 224x224)
"""

import sys

import numpy as np
import tvm
from tvm import relax

import tsl
import tsl.relax
from tsl.relax import models

small = "--full" not in sys.argv

# 1. A model written with tvm.relax.frontend.nn, its weights bound as constants (so that tsl
#    packs them once, at compile time, into the layout its kernels read).
model, shape = models.resnet18(small=small)
mod, weights, x = models.export(model, shape)

# 2. Which calls tsl takes, before compiling anything.
print(tsl.relax.report(mod, "cpu"))

# 3. Compile: the TVM target for the host (its vector extensions on), tsl's pipeline, and the
#    TIR pipeline tsl's CPU kernels are lowered with (their weight prefetch).
target = tsl.relax.tvm_target("cpu")
ex = tvm.compile(mod, target=target, relax_pipeline=tsl.relax.pipeline("cpu"),
                 tir_pipeline=tsl.relax.tir_pipeline("cpu"))
vm = relax.VirtualMachine(ex, tvm.cpu())
y = vm["forward"](tvm.runtime.tensor(x)).numpy()

# 4. The same model through TVM's default pipeline: the same function.
ref = relax.VirtualMachine(tvm.compile(mod, target=target), tvm.cpu())["forward"](
    tvm.runtime.tensor(x)).numpy()
err = np.linalg.norm(y - ref) / np.linalg.norm(ref)
print(f"ResNet-18{' (small)' if small else ''}: logits {y.shape}, relative difference to TVM's "
      f"pipeline {err:.1e}")
assert err < 1e-5

# 5. One kernel as a TVM user sees it: `art.mod` is the scheduled IRModule tvm.compile takes.
art = tsl.build(tsl.ops.conv2d(1, 64, 56, 56, 64, 3, 3, padding=1,
                               epilogue=tsl.ops.bias() + tsl.ops.relu()), "cpu")
print(f"art.mod: {type(art.mod).__name__}, functions {[g.name_hint for g in art.mod.get_global_vars()]}")

# 6. The same weights in PyTorch eager (when installed): the same function once more. Timing
#    the three (tsl, TVM's default pipeline, PyTorch) is the bench's: python -m tsl.bench --models
try:
    import torch
except ImportError:
    print("PyTorch is not installed: no eager comparison (pip install torch)")
else:
    with torch.inference_mode():
        eager = models.torch_forward("resnet18", weights, small)(torch.from_numpy(x)).numpy()
    err = np.linalg.norm(y - eager) / np.linalg.norm(eager)
    print(f"relative difference to PyTorch eager on the same weights {err:.1e}")
    assert err < 1e-4

# 7. int8: requantize epilogues (bias, relu, >> shift, clip, -> int8) on tsl's exact int8
#    kernels; the logits equal TVM's bit for bit.
mod8, x8 = models.resnet18_int8(small=small)
reports = []  # the pipeline's own report of what it swapped
logits = [relax.VirtualMachine(tvm.compile(mod8, target=target, relax_pipeline=pipe),
                               tvm.cpu())["forward"](tvm.runtime.tensor(x8)).numpy()
          for pipe in (tsl.relax.pipeline("cpu", reports=reports), "default")]
taken = len(reports[-1].taken)
print(f"int8 ResNet-18: logits equal TVM's: {np.array_equal(*logits)}, {taken} functions to tsl")
assert np.array_equal(*logits) and taken > 0
