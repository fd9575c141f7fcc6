"""The CPU back end end to end: every operator x dtype against NumPy, odd shapes included, on
every CPU machine this host runs, and the structure of what the shared schedule lowers to."""

import re

import numpy as np
import pytest

import tsl
from tsl import ops
from tsl.errors import BackendUnavailable, InputError, TAMError
from tsl.backends.cpu import detect, host

from conftest import cpu_machines, other_cpu_machines

DTYPES = ["float32", "bfloat16", "int8"]
# The instruction each int8 intrinsic of the built-in machine files must become.
MNEMONIC = {"llvm.x86.avx2.pmadd.wd": "vpmaddwd", "llvm.x86.avx512.vpdpbusd.512": "vpdpbusd",
            "llvm.x86.avx512.vpdpbusd.256": "vpdpbusd",
            "llvm.aarch64.neon.sdot.v4i32.v16i8": "sdot"}


@pytest.fixture(params=cpu_machines())
def machine(request):
    return host.specialize(tsl.load_machine(request.param), host.info())


def check(op, machine, seed=3, **knobs):
    art = tsl.build(op, machine, knobs=knobs or None)
    xs = op.random_inputs(seed)
    got = art.run(*xs)
    want = op.reference(*xs)
    assert got.shape == want.shape and got.dtype == want.dtype
    ok, err = op.check(got, want)
    assert ok, f"{op} on {machine.name}: error {err}"
    return art


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape", [(64, 64, 64), (37, 50, 29), (1, 130, 7)])
def test_matmul(machine, dtype, shape):
    check(ops.matmul(*shape, dtype=dtype), machine)


@pytest.mark.parametrize("dtype", DTYPES)
def test_matmul_transpose_b_and_epilogues(machine, dtype):
    ep = (ops.requantize(shift=7, bias=True, clip=(-20, 100)) if dtype == "int8"
          else ops.bias() + ops.relu())
    check(ops.matmul(45, 33, 70, dtype=dtype, transpose_b=True, epilogue=ep), machine)


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_batch_matmul(machine, dtype):
    check(ops.batch_matmul(3, 20, 40, 24, dtype=dtype), machine)


@pytest.mark.parametrize("dtype", DTYPES)
def test_dense_bias_relu(machine, dtype):
    ep = ops.requantize(shift=6, bias=True, clip=(0, 127)) if dtype == "int8" else None
    check(ops.dense(17, 70, 40, dtype=dtype, epilogue=ep), machine)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("geom", [dict(stride=1, padding=1), dict(stride=2, padding=0),
                                  dict(stride=1, padding=2, dilation=2)])
def test_conv2d(machine, layout, dtype, geom):
    ep = ops.requantize(shift=8, bias=True, clip=(0, 127)) if dtype == "int8" else ops.relu()
    check(ops.conv2d(1, 19, 11, 9, 21, 3, 3, layout=layout, dtype=dtype, epilogue=ep, **geom),
          machine)


@pytest.mark.parametrize("layout", ["NCHW", "NHWC"])
@pytest.mark.parametrize("dtype", DTYPES)
def test_conv2d_batch_and_1x1_unpadded(machine, layout, dtype):
    check(ops.conv2d(2, 16, 8, 8, 32, 1, 1, stride=2, layout=layout, dtype=dtype), machine)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("channels,stride", [(32, 1), (24, 2), (48, 1)])
def test_conv2d_nhwc_activations_in_channel_blocks(machine, dtype, channels, stride):
    """NHWC activations are packed in blocks of channels (a cache line, or the largest power
    of two dividing C) for windows wider than 1x1: exact at every block size."""
    art = check(ops.conv2d(1, channels, 9, 10, 24, 3, 3, stride=stride, padding=1,
                           layout="NHWC", dtype=dtype,
                           epilogue=ops.relu() if dtype != "int8" else None), machine)
    if art.schedule.primitive.m == 1:  # (smmla's 2-row primitive packs pixels instead)
        blocked = re.search(r"A_\w+ = T\.sblock_alloc_buffer\(\(1, (\d+), \d+, \d+, (\d+)\)",
                            art.tir())
        assert blocked and int(blocked[1]) * int(blocked[2]) == channels > int(blocked[1])


@pytest.mark.parametrize("name", other_cpu_machines() or
                         [pytest.param("-", marks=pytest.mark.skip(
                             reason="this host runs no other built-in CPU machine"))])
@pytest.mark.parametrize("dtype", DTYPES)
def test_other_runnable_machines(name, dtype):
    m = host.specialize(tsl.load_machine(name), host.info())
    check(ops.matmul(37, 50, 29, dtype=dtype), m)
    check(ops.conv2d(1, 19, 11, 9, 21, 3, 3, padding=1, dtype=dtype), m)


def test_int8_instruction_is_used_and_exact_over_full_int8_range(machine):
    op = ops.matmul(64, 64, 128, dtype="int8")
    art = check(op, machine)
    p = art.schedule.primitive
    if p.intrinsic:
        assert MNEMONIC[p.intrinsic] in art.source("asm")
        assert "T.call_llvm_pure_intrin" in art.tir()     # the block body is the intrinsic
    for a, b in ((-128, -128), (-128, 127), (127, 127)):
        xs = [np.full((64, 128), a, np.int8), np.full((128, 64), b, np.int8)]
        assert (art.run(*xs) == a * b * 128).all()


def test_fp32_micro_kernel_structure(machine):
    art = tsl.build(ops.matmul(256, 256, 256), machine)
    tir = art.tir()
    lanes = art.schedule.primitive.n
    assert "T.parallel" in tir and f"T.vectorized({lanes})" in tir and "T.unroll" in tir
    # B is packed into blocks of the register tile's width (n_inner x lanes).
    nb = art.schedule.knob_values["n_inner"] * lanes
    assert f'B: T.Buffer(({-(-256 // nb)}, 256, {nb}), "float32")' in tir
    asm = art.source("asm")
    assert "vfmadd" in asm or "fmla" in asm


def test_gemm_activations_packed_in_stored_order(machine):
    """The in-kernel stage that packs A for the register tile (A[M, K] -> [M/mr, K, mr]) runs
    over the packed layout: its vector loop is the tile's mr rows, stored contiguously, not
    K (which stored one element per mr-element row block), at a row count mr does not
    divide too."""
    for m in (128, 100):
        art = check(ops.dense(m, 96, 48), machine, m_inner=4)
        mr = 4 * art.schedule.primitive.m
        tir = art.tir()
        assert f'A_global = T.sblock_alloc_buffer(({-(-m // mr)}, 96, {mr}))' in tir, tir
        assert re.search(rf"for ax2 in T.vectorized\({mr}\):\s+with T.sblock\(\"A_global\"\)",
                         tir), tir


def test_knobs_change_the_nest(machine):
    op = ops.matmul(128, 128, 128)
    a = tsl.build(op, machine, knobs={"m_inner": 4, "n_inner": 1, "k_inner": 32})
    assert a.verify()[0]
    n = a.schedule.primitive.n
    assert f'B: T.Buffer(({128 // n}, 128, {n}), "float32")' in a.tir()


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op,knob,loop", [
    (lambda dt: ops.matmul(40, 48, 100, dtype=dt), "k_inner", "k_0_k_1"),
    (lambda dt: ops.conv2d(1, 40, 9, 10, 24, 1, 1, stride=2, dtype=dt), "ci_inner",
     "ci_0_r_s_ci_1")])
def test_reduction_block_runs_as_one_loop(machine, dtype, op, knob, loop):
    """The inner split of the reduction only sizes the tiles the caches keep: its loop and the
    loop over the blocks (with a 1x1 window's r and s between them) run as one (a short inner
    loop LLVM unrolls whole, spilling the register tile), exact where the block does not
    divide the reduction."""
    art = check(op(dtype), machine, **{knob: 4})
    # (printed with its annotation where it prefetches: `lowering._prefetch_weights`)
    assert re.search(rf"for {loop}_fused in (range|T\.serial)\(\d+", art.tir())


def test_input_errors():
    op = ops.matmul(8, 8, 8)
    art = tsl.build(op, "cpu")
    a, b = op.random_inputs()
    with pytest.raises(InputError, match="takes 2 arrays"):
        art.run(a)
    with pytest.raises(InputError, match=r"input B must have shape \(8, 8\)"):
        art.run(a, b[:4])
    with pytest.raises(InputError, match="input A must be float32, got float64"):
        art.run(a.astype(np.float64), b)


def variant(tmp_path, name, edit):
    """A copy of the detected machine's file under another name, edited by `edit`."""
    src = open(detect().source).read()
    base = detect().name
    p = tmp_path / f"{name}.toml"
    p.write_text(edit(src.replace(f'name = "{base}"', f'name = "{name}"', 1)))
    return tsl.load_machine(p)


def test_missing_cpu_feature_is_backend_unavailable(tmp_path):
    m = variant(tmp_path, "fancy", lambda s: s.replace("require = [", 'require = ["sme2", ', 1))
    with pytest.raises(BackendUnavailable, match=r"lacks \['sme2'\].*machines it runs"):
        tsl.build(ops.matmul(8, 8, 8), m)


@pytest.mark.parametrize("ahead", [0, 4096])
def test_gemm_weights_prefetched_as_the_file_says(tmp_path, ahead):
    """`params.prefetch_bytes` > 0: a GEMM whose tile's weight panel outgrows the L1
    prefetches it that far ahead, exact at rows, columns and steps the tile does not divide;
    0, a panel that fits the L1, and a conv: no prefetch of weights (the hardware's alone)."""
    m = variant(tmp_path, "prefetching", lambda s: re.sub(
        r"\nprefetch_bytes = \d+\n", "\n", s).replace(
        "[params]\n", f"[params]\nprefetch_bytes = {ahead}\n", 1))
    p = m.primitive("float32")
    l1 = m.memory_level(p.b_level).capacity
    hint = "prefetcht0" if m.params.arch == "x86_64" else "prfm"
    long_k = 2 * l1 // (4 * p.n) + 3  # the panel of a one-vector-wide tile: twice the L1
    asm = {k: check(ops.dense(100, k, 40), m, m_inner=4, n_inner=1).source("asm")
           for k in (long_k, 96)}
    conv = check(ops.conv2d(1, 19, 11, 9, 21, 3, 3, padding=1), m)
    assert (hint in asm[long_k]) == (ahead > 0)
    assert hint not in asm[96]
    assert hint not in conv.source("asm")


@pytest.mark.parametrize("ahead", [0, 2])
def test_conv_input_rows_prefetched_as_the_file_says(tmp_path, ahead):
    """`params.prefetch_channels` > 0: a stride-1 NCHW conv whose channel plane (39 x 31 padded
    floats, 4.8 KB) is longer than `prefetch_stride_bytes` prefetches its window's input rows
    that many channels ahead: the first and last element of each of the 3 rows (a 7-pixel
    tile's 9 columns, within two lines), exact at channels, columns and output channels the
    tiles do not divide; a plane of 1.2 KB, stride 2 or a 1x1 window: none."""
    def edit(s):
        s = re.sub(r"^prefetch_(channels|stride_bytes) = \d+\n", "", s, flags=re.M)
        return s.replace("[params]\n", f"[params]\nprefetch_channels = {ahead}\n"
                         "prefetch_stride_bytes = 2048\n", 1)

    m = variant(tmp_path, "rows", edit)
    hint = "prefetcht0" if m.params.arch == "x86_64" else "prfm"
    knobs = dict(ci_inner=1, w_inner=7, h_inner=1, co_inner=1, reduce_rows=False)
    big = check(ops.conv2d(1, 5, 37, 29, 20, 3, 3, padding=1), m, **knobs).source("asm")
    assert big.count(hint) == (6 if ahead else 0)
    for op in (ops.conv2d(1, 5, 15, 17, 20, 3, 3, padding=1),
               ops.conv2d(1, 5, 37, 29, 20, 3, 3, stride=2, padding=1),
               ops.conv2d(1, 5, 37, 29, 20, 1, 1)):
        assert hint not in check(op, m, **knobs).source("asm")


def test_a_new_cpu_variant_is_one_toml_file(tmp_path):
    """Twice the lanes per primitive, fewer accumulator registers, and int8 through the
    generic vector kind instead of the file's instruction: no Python change."""
    base = detect()
    p32 = base.primitive("float32")
    p8 = base.primitive("int8") or base.primitive("uint8", "int8")

    def edit(s):
        s = s.replace(f'name = "{p32.name}"\nkind = "matmul"\ninstruction = "vector"\nm = 1\n'
                      f'n = {p32.n}\n', f'name = "{p32.name}"\nkind = "matmul"\n'
                      f'instruction = "vector"\nm = 1\nn = {2 * p32.n}\n')
        acc = next(lv for lv in base.memory if lv.role == "accumulator")
        at = s.index(f'name = "{acc.name}"')
        s = s[:at] + re.sub(r'capacity = "[^"]*"', f'capacity = "{acc.capacity // 2} B"',
                            s[at:], count=1)
        start = s.index(f'name = "{p8.name}"')
        end = s.index("[[", start)
        block = (f'name = "{p8.name}"\nkind = "matmul"\ninstruction = "vector"\nm = 1\n'
                 f'n = {p32.n}\nk = 1\na_dtype = "int8"\nb_dtype = "int8"\nacc_dtype = "int32"\n'
                 f'a_level = "{p8.a_level}"\nb_level = "{p8.b_level}"\nc_level = "{p8.c_level}"\n'
                 f'macs_per_cycle = 4.0\n\n')
        return s[:start] + block + s[end:]

    m = host.specialize(variant(tmp_path, "wide", edit), host.info())
    assert m.primitive("float32").n == 2 * p32.n
    assert [lv.capacity for lv in m.memory if lv.role == "accumulator"] == [
        lv.capacity // 2 for lv in base.memory if lv.role == "accumulator"]
    art = check(ops.matmul(40, 70, 33), m)
    assert f"T.vectorized({2 * p32.n})" in art.tir()
    art8 = check(ops.matmul(40, 70, 33, dtype="int8"), m)
    assert "T.call_llvm_pure_intrin" not in art8.tir()


def test_unknown_instruction_kind_is_a_tam_error(tmp_path):
    m = variant(tmp_path, "odd", lambda s: s.replace('instruction = "vector"',
                                                      'instruction = "systolic"', 1))
    with pytest.raises(TAMError, match="instruction kinds .*'systolic'"):
        tsl.build(ops.matmul(8, 8, 8), host.specialize(m, host.info()))


def test_estimate_and_source():
    art = tsl.build(ops.matmul(100, 100, 100), "cpu")
    est = art.estimate()
    assert est.macs == 100 ** 3 and est.padded_macs >= est.macs
    assert est.kind == "model" and "model estimate" in str(est)
    assert "define" in art.source()


def test_primitive_scratch_counts_against_the_accumulator_level(tmp_path):
    """A primitive that needs registers of its own besides the accumulator tile (vpmaddwd)
    leaves less room for the tile: the file says how much, the schedule checks it."""
    base = detect()
    p8 = base.primitive("int8") or base.primitive("uint8", "int8")
    acc = next(lv for lv in base.memory if lv.name == p8.c_level)

    def edit(s):
        at = s.index(f'name = "{p8.name}"')
        s = s[:at] + s[at:].replace("latency", f"scratch = {acc.capacity - 4 * p8.n}\nlatency",
                                    1)
        return re.sub(r'\nscratch = "[^"]*"', "", s, count=1) if p8.scratch else s

    m = host.specialize(variant(tmp_path, "tight", edit), host.info())
    op = ops.matmul(64, 64, 64, dtype="int8")
    with pytest.raises(tsl.ScheduleError, match=rf"{p8.name}'s scratch"):
        tsl.build(op, m, knobs={"m_inner": 2, "n_inner": 1})
    assert tsl.build(op, m, knobs={"m_inner": 1, "n_inner": 1}).verify()[0]
