"""Whole models as Relax modules, for the tutorials, the tests and the bench to compile:
ResNet-18 (float, NCHW or NHWC, and int8 as VTA runs it) and a BERT-base encoder layer.

The models are written with `tvm.relax.frontend.nn` (no extra dependency) or a BlockBuilder
(the int8 ResNet-18); their PyTorch twins (`torch_forward`) read the same weight arrays.
BatchNorm is folded into the convolutions' bias, as inference compilers do. `small=True` gives
the same architectures, narrow and short, for the tests and the tutorials. Timing them is the
bench's (`python -m tsl.bench --models`, tsl/bench/models.py).
"""

from __future__ import annotations

import numpy as np

# ResNet-18: (channels, first stride) of the four stages, two basic blocks each.
RESNET_STAGES = ((64, 1), (128, 2), (256, 2), (512, 2))
RESNET_SMALL = dict(width=8, image=32, classes=10)
RESNET_FULL = dict(width=64, image=224, classes=1000)
BERT_FULL = dict(seq=128, hidden=768, heads=12, ffn=3072)
BERT_SMALL = dict(seq=16, hidden=64, heads=2, ffn=128)


def _nn():
    from tvm.relax.frontend import nn

    return nn


# -- ResNet-18 ---------------------------------------------------------------------------------
def _conv_module(nn):
    from tvm import relax

    class Conv(nn.Module):
        """conv2d + bias; NCHW with OIHW weights or NHWC with HWIO weights (what tsl's NHWC
        conv takes: input channels before output channels)."""

        def __init__(self, cin, cout, k, stride=1, padding=0, layout="NCHW", dtype="float32"):
            self.stride, self.padding, self.layout = stride, padding, layout
            shape = (cout, cin, k, k) if layout == "NCHW" else (k, k, cin, cout)
            self.weight = nn.Parameter(shape, dtype)
            self.bias = nn.Parameter((cout,), dtype)

        def forward(self, x):
            y = relax.op.nn.conv2d(x._expr, self.weight._expr, strides=self.stride,
                                   padding=self.padding, data_layout=self.layout,
                                   kernel_layout="OIHW" if self.layout == "NCHW" else "HWIO")
            b = relax.op.reshape(self.bias._expr,
                                 (1, -1, 1, 1) if self.layout == "NCHW" else (1, 1, 1, -1))
            return nn.wrap_nested(relax.op.add(y, b), "conv")
    return Conv


def resnet18(small: bool = False, layout: str = "NCHW", dtype: str = "float32"):
    """ResNet-18 (batch 1) as a `relax.frontend.nn` module and its input shape."""
    from tvm import relax

    nn = _nn()
    Conv = _conv_module(nn)
    cfg = RESNET_SMALL if small else RESNET_FULL
    w, chan = cfg["width"], 1 if layout == "NCHW" else 3
    kw = dict(layout=layout, dtype=dtype)

    class Block(nn.Module):
        def __init__(self, cin, cout, stride):
            self.conv1 = Conv(cin, cout, 3, stride, 1, **kw)
            self.conv2 = Conv(cout, cout, 3, 1, 1, **kw)
            self.down = Conv(cin, cout, 1, stride, 0, **kw) if stride != 1 or cin != cout else None

        def forward(self, x):
            y = self.conv2(nn.relu(self.conv1(x)))
            return nn.relu(y + (self.down(x) if self.down is not None else x))

    class ResNet18(nn.Module):
        def __init__(self):
            self.conv1 = Conv(3, w, 7, 2, 3, **kw)
            blocks, cin = [], w
            for c, s in RESNET_STAGES:
                c = c * w // 64
                blocks += [Block(cin, c, s), Block(c, c, 1)]
                cin = c
            self.blocks = nn.ModuleList(blocks)
            self.fc = nn.Linear(cin, cfg["classes"], dtype=dtype)

        def forward(self, x):
            y = nn.relu(self.conv1(x))
            y = nn.wrap_nested(relax.op.nn.max_pool2d(y._expr, 3, 2, 1, layout=layout), "pool")
            for b in self.blocks:
                y = b(y)
            hw = [2, 3] if layout == "NCHW" else [1, 2]
            y = nn.wrap_nested(relax.op.mean(y._expr, hw), "gap")
            return self.fc(y)

    shape = (1, 3, cfg["image"], cfg["image"]) if chan == 1 else (1, cfg["image"], cfg["image"], 3)
    return ResNet18(), shape


# -- BERT-base encoder layer -------------------------------------------------------------------
def bert_layer(small: bool = False, dtype: str = "float32"):
    """One BERT-base encoder layer (post-LayerNorm, GELU) at batch 1 and its input shape."""
    nn = _nn()
    cfg = BERT_SMALL if small else BERT_FULL
    s, h, heads, f = cfg["seq"], cfg["hidden"], cfg["heads"], cfg["ffn"]
    d = h // heads

    class BertLayer(nn.Module):
        def __init__(self):
            self.q, self.k, self.v = (nn.Linear(h, h, dtype=dtype) for _ in range(3))
            self.o = nn.Linear(h, h, dtype=dtype)
            self.ln1 = nn.LayerNorm(h, eps=1e-12, dtype=dtype)
            self.ff1 = nn.Linear(h, f, dtype=dtype)
            self.ff2 = nn.Linear(f, h, dtype=dtype)
            self.ln2 = nn.LayerNorm(h, eps=1e-12, dtype=dtype)

        def forward(self, x):
            def heads_of(t):
                return nn.op.permute_dims(nn.op.reshape(t, (1, s, heads, d)), (0, 2, 1, 3))

            q, k, v = heads_of(self.q(x)), heads_of(self.k(x)), heads_of(self.v(x))
            scores = nn.op.matmul(q, nn.op.permute_dims(k, (0, 1, 3, 2))) / float(np.sqrt(d))
            ctx = nn.op.matmul(nn.op.softmax(scores, axis=-1), v)
            ctx = nn.op.reshape(nn.op.permute_dims(ctx, (0, 2, 1, 3)), (1, s, h))
            x = self.ln1(x + self.o(ctx))
            return self.ln2(x + self.ff2(nn.op.gelu(self.ff1(x))))

    return BertLayer(), (1, s, h)


# -- weights, export, PyTorch twins ------------------------------------------------------------
def random_weights(params, seed: int = 0, layout: str = "NCHW") -> dict:
    """He-scaled random weights (so activations stay O(1) through 18 layers), small biases,
    LayerNorm scales near 1. Conv weights are OIHW for NCHW models, HWIO for NHWC ones."""
    rng = np.random.default_rng(seed)
    out = {}
    for name, p in params:
        shape = tuple(int(x) for x in p.shape)
        if name.endswith("bias"):
            w = rng.uniform(-0.1, 0.1, shape)
        elif name.startswith("ln"):
            w = 1 + rng.uniform(-0.1, 0.1, shape)
        else:
            fan_in = (shape[-1] if len(shape) == 2 else
                      int(np.prod(shape[1:] if layout == "NCHW" else shape[:3])))
            w = rng.normal(0, np.sqrt(2.0 / fan_in), shape)
        out[name] = w.astype(str(p.dtype))
    return out


def export(model, shape, dtype: str = "float32", seed: int = 0, layout: str = "NCHW"):
    """(Relax module with the weights bound as constants, weights, one input)."""
    import tvm
    from tvm import relax

    nn = _nn()
    mod, params = model.export_tvm({"forward": {"x": nn.spec.Tensor(shape, dtype)}})
    weights = random_weights(params, seed, layout)
    mod = relax.transform.BindParams("forward", {k: tvm.runtime.tensor(v)
                                                 for k, v in weights.items()})(mod)
    x = np.random.default_rng(seed + 1).uniform(-1, 1, shape).astype(dtype)
    return mod, weights, x


def torch_forward(name: str, weights: dict, small: bool = False):
    """The PyTorch eager twin of model `name` ("resnet18" / "bert") on the same weights (NCHW,
    float32): a function of one torch tensor."""
    import torch
    import torch.nn.functional as F

    W = {k: torch.from_numpy(np.ascontiguousarray(v)) for k, v in weights.items()}
    if name == "resnet18":
        def conv(p, x, stride, pad):
            return F.conv2d(x, W[p + ".weight"], W[p + ".bias"], stride, pad)

        def fwd(x):
            y = F.max_pool2d(F.relu(conv("conv1", x, 2, 3)), 3, 2, 1)
            i = 0
            for c, s in RESNET_STAGES:
                for stride in (s, 1):
                    p = f"blocks.{i}"
                    r = conv(p + ".down", y, stride, 0) if p + ".down.weight" in W else y
                    z = conv(p + ".conv2", F.relu(conv(p + ".conv1", y, stride, 1)), 1, 1)
                    y = F.relu(z + r)
                    i += 1
            return F.linear(y.mean((2, 3)), W["fc.weight"], W["fc.bias"])
        return fwd
    cfg = BERT_SMALL if small else BERT_FULL
    s, h, heads = cfg["seq"], cfg["hidden"], cfg["heads"]
    d = h // heads

    def lin(p, x):
        return F.linear(x, W[p + ".weight"], W[p + ".bias"])

    def fwd(x):
        def split(t):
            return t.reshape(1, s, heads, d).permute(0, 2, 1, 3)
        q, k, v = split(lin("q", x)), split(lin("k", x)), split(lin("v", x))
        p = torch.softmax(q @ k.transpose(-1, -2) / float(np.sqrt(d)), -1)
        ctx = (p @ v).permute(0, 2, 1, 3).reshape(1, s, h)
        x = F.layer_norm(x + lin("o", ctx), (h,), W["ln1.weight"], W["ln1.bias"], 1e-12)
        return F.layer_norm(x + lin("ff2", F.gelu(lin("ff1", x))), (h,), W["ln2.weight"],
                            W["ln2.bias"], 1e-12)
    return fwd


# -- int8 ResNet-18 ----------------------------------------------------------------------------
def resnet18_int8(small: bool = False, seed: int = 0):
    """An int8 ResNet-18 as VTA runs it (Relax module with constant weights, one input): every
    conv is int8 x int8 -> int32, + bias, (relu), >> shift, clip to [-128, 127], -> int8; a
    residual is added in int32 before the clip. The classifier returns int32 logits."""
    from tvm import relax

    cfg = RESNET_SMALL if small else RESNET_FULL
    w, img = cfg["width"], cfg["image"]
    rng = np.random.default_rng(seed)
    bb = relax.BlockBuilder()
    x = relax.Var("x", relax.TensorType((1, 3, img, img), "int8"))

    def requant(acc, shift, relu=False, residual=None):
        if relu and residual is None:
            acc = bb.emit(relax.op.nn.relu(acc))
        acc = bb.emit(relax.op.right_shift(acc, relax.const(shift, "int32")))
        if residual is not None:  # added at the output's scale, then relu
            acc = bb.emit(relax.op.add(acc, relax.op.astype(residual, "int32")))
            acc = bb.emit(relax.op.nn.relu(acc)) if relu else acc
        return bb.emit(relax.op.astype(relax.op.clip(acc, -128, 127), "int8"))

    def conv(t, cin, cout, k, stride, pad):
        wt = rng.integers(-64, 65, (cout, cin, k, k), dtype=np.int8)
        b = rng.integers(-512, 513, (1, cout, 1, 1), dtype=np.int32)
        y = bb.emit(relax.op.nn.conv2d(t, relax.const(wt), strides=stride, padding=pad,
                                       out_dtype="int32"))
        # Shift so that the int8 result uses its range: |acc| ~ sqrt(fan_in) * 40 * 40.
        shift = int(round(np.log2(np.sqrt(cin * k * k) * 40)))
        return bb.emit(relax.op.add(y, relax.const(b))), shift

    with bb.function("forward", [x]):
        with bb.dataflow():
            y, s = conv(x, 3, w, 7, 2, 3)
            y = requant(y, s, relu=True)
            y = bb.emit(relax.op.nn.max_pool2d(y, 3, 2, 1))
            cin = w
            for c, st in RESNET_STAGES:
                c = c * w // 64
                for stride in (st, 1):
                    h, s1 = conv(y, cin, c, 3, stride, 1)
                    h = requant(h, s1, relu=True)
                    h, s2 = conv(h, c, c, 3, 1, 1)
                    r = y
                    if stride != 1 or cin != c:
                        r, s3 = conv(y, cin, c, 1, stride, 0)
                        r = requant(r, s3)
                    y = requant(h, s2, relu=True, residual=r)
                    cin = c
            side = int(y.ty.shape[2])
            pooled = bb.emit(relax.op.sum(relax.op.astype(y, "int32"), [2, 3]))
            pooled = bb.emit(relax.op.astype(relax.op.clip(relax.op.right_shift(
                pooled, relax.const(int(np.log2(side * side)), "int32")), -128, 127), "int8"))
            fc = rng.integers(-64, 65, (cin, cfg["classes"]), dtype=np.int8)
            out = bb.emit(relax.op.matmul(pooled, relax.const(fc), out_dtype="int32"))
            out = bb.emit_output(out)
        bb.emit_func_output(out)
    xin = rng.integers(-128, 128, (1, 3, img, img), dtype=np.int8)
    return bb.get(), xin
