"""VTA configuration and ISA encoding: layouts against docs/vta.md, round trips, overflow."""
import dataclasses

import numpy as np
import pytest

from tsl.backends.vta.config import DEFAULT, VTAConfig
from tsl.backends.vta.isa import (Alu, AluOp, Deps, Finish, Gemm, Load, Mem, Store, Uop, decode,
                                  decode_uop, decode_uops, encode, encode_uop, encode_uops,
                                  format_insn, from_words, layout, to_words, uop_layout)
from tsl.errors import LoweringError

BLOCK32 = VTAConfig(log_block_in=5, log_block_out=5, log_inp_buff_size=16,
                    log_wgt_buff_size=19, log_acc_buff_size=18)
CONFIGS = [DEFAULT, BLOCK32, VTAConfig(log_block_in=5, log_block_out=5)]

# docs/vta.md §2, as (first bit, last bit)
VTA_MD = {
    Load: {"opcode": (0, 2), "pop_prev": (3, 3), "pop_next": (4, 4), "push_prev": (5, 5),
           "push_next": (6, 6), "mem": (7, 9), "sram_base": (10, 25), "dram_base": (26, 57),
           "y_size": (64, 79), "x_size": (80, 95), "x_stride": (96, 111), "y_pad0": (112, 115),
           "y_pad1": (116, 119), "x_pad0": (120, 123), "x_pad1": (124, 127)},
    Gemm: {"reset": (7, 7), "uop_bgn": (8, 20), "uop_end": (21, 34), "iter_out": (35, 48),
           "iter_in": (49, 62), "dst_factor_out": (64, 74), "dst_factor_in": (75, 85),
           "src_factor_out": (86, 96), "src_factor_in": (97, 107),
           "wgt_factor_out": (108, 117), "wgt_factor_in": (118, 127)},
    Alu: {"uop_bgn": (8, 20), "dst_factor_out": (64, 74), "src_factor_in": (97, 107),
          "alu_op": (108, 110), "use_imm": (111, 111), "imm": (112, 127)},
}


def _fields(cls, config):
    return {f.name: f for f in layout(cls, config)}


def test_default_config_matches_vta_md_table():
    c = DEFAULT
    assert (c.batch, c.block_in, c.block_out) == (1, 16, 16)
    assert (c.inp_entry_bytes, c.wgt_entry_bytes, c.acc_entry_bytes, c.out_entry_bytes,
            c.uop_bytes) == (16, 256, 64, 16, 4)
    assert (c.uop_depth, c.inp_depth, c.wgt_depth, c.acc_depth, c.out_depth) == \
        (8192, 2048, 1024, 2048, 2048)
    assert (c.log_uop_depth, c.log_inp_depth, c.log_wgt_depth, c.log_acc_depth) == \
        (13, 11, 10, 11)


def test_config_from_params():
    c = VTAConfig.from_params({"log_block_in": 5, "log_block_out": 5, "dma_latency": 10})
    assert (c.block_in, c.block_out, c.dma_latency, c.wgt_entry_bytes) == (32, 32, 10, 1024)
    with pytest.raises(ValueError, match="log_blok_in"):
        VTAConfig.from_params({"log_blok_in": 5})
    with pytest.raises(ValueError, match="gemm_ii"):
        VTAConfig(gemm_ii=0)
    with pytest.raises(ValueError, match="WGT buffer"):
        VTAConfig(log_wgt_buff_size=7)


def test_default_layout_is_vta_md():
    for cls, expect in VTA_MD.items():
        got = _fields(cls, DEFAULT)
        for name, (lo, hi) in expect.items():
            assert (got[name].lo, got[name].lo + got[name].width - 1) == (lo, hi), (cls, name)
    assert _fields(Store, DEFAULT) == _fields(Load, DEFAULT)
    assert [(f.name, f.lo, f.width) for f in uop_layout(DEFAULT)] == \
        [("dst", 0, 11), ("src", 11, 11), ("wgt", 22, 10)]


def test_hand_computed_bits():
    assert encode(Finish()) == 3
    assert encode(Finish(Deps(pop_prev=True, push_next=True))) == 3 | 1 << 3 | 1 << 6
    assert encode(Load(Mem.INP, 1, 0, 0, 0, 0)) == (2 << 7) | (1 << 10)
    assert encode(Load(Mem.WGT, 0, 1, 1, 0, 0)) == (1 << 7) | (1 << 26) | (1 << 64)
    assert encode(Store(Mem.OUT, 0, 0, 0, 0, 1, x_pad1=15)) == 1 | 4 << 7 | 1 << 96 | 15 << 124
    assert encode(Gemm(True, 1, 2, 0, 0, 0, 0, 0, 0, 0, 1)) == \
        2 | 1 << 7 | 1 << 8 | 2 << 21 | 1 << 118
    assert encode(Alu(0, 0, 0, 0, 0, 0, 0, 0, AluOp.SHR, True, -1)) == \
        4 | 3 << 108 | 1 << 111 | 0xFFFF << 112
    assert encode_uop(Uop(dst=1, src=1, wgt=1)) == 1 | 1 << 11 | 1 << 22


def _random_insns(rng, config, n):
    """Every kind with all fields at 0, at their max (min too for imm), and n random."""
    out = []
    for cls in (Load, Store, Gemm, Alu, Finish):
        fs = {k: f for k, f in _fields(cls, config).items() if k != "opcode"}
        for mode in ["zero", "max", "min"] + ["random"] * n:
            kw = {}
            for name, f in fs.items():
                if f.kind == "sint":
                    lo, hi = -(1 << (f.width - 1)), (1 << (f.width - 1)) - 1
                else:
                    lo, hi = 0, (1 << f.width) - 1
                v = {"zero": 0, "max": hi, "min": lo}.get(mode, int(rng.integers(lo, hi + 1)))
                if name == "mem":
                    choices = [Mem.OUT] if cls is Store else [m for m in Mem if m != Mem.OUT]
                    v = choices[{"zero": 0, "max": -1, "min": 0}.get(mode,
                                                                       rng.integers(len(choices)))]
                if name == "alu_op":
                    v = AluOp(min(v, max(AluOp)))
                kw[name] = bool(v) if f.kind == "bool" else v
            deps = {k: kw.pop(k) for k in list(kw) if k.startswith(("pop", "push"))}
            out.append(cls(**kw, deps=Deps(**deps)))
    return out


@pytest.mark.parametrize("config", CONFIGS, ids=["default", "block32-big", "block32"])
def test_round_trip(config):
    rng = np.random.default_rng(1)
    program = _random_insns(rng, config, 20)
    for insn in program:
        word = encode(insn, config)
        assert 0 <= word < 1 << 128
        assert decode(word, config) == insn, format_insn(insn)
    words = to_words(program, config)
    assert words.dtype == np.uint64 and words.shape == (len(program), 2)
    w0 = encode(program[0], config)
    assert (int(words[0, 0]), int(words[0, 1])) == (w0 & (1 << 64) - 1, w0 >> 64)
    assert from_words(words, config) == program


@pytest.mark.parametrize("config", CONFIGS, ids=["default", "block32-big", "block32"])
def test_uop_round_trip(config):
    rng = np.random.default_rng(2)
    widths = [f.width for f in uop_layout(config)]
    arr = np.stack([rng.integers(0, 1 << w, 200) for w in widths], axis=1)
    arr[0] = 0
    arr[1] = [(1 << w) - 1 for w in widths]
    words = encode_uops(arr, config)
    assert words.dtype == np.uint32
    assert (decode_uops(words, config) == arr).all()
    uops = [Uop(*map(int, row)) for row in arr[:20]]
    assert [encode_uop(u, config) for u in uops] == list(words[:20])
    assert [decode_uop(int(w), config) for w in words[:20]] == uops
    assert (encode_uops(uops, config) == words[:20]).all()


def test_second_config_changes_widths():
    f = _fields(Gemm, VTAConfig(log_block_in=5, log_block_out=5))
    assert (f["dst_factor_out"].lo, f["dst_factor_out"].width) == (64, 10)
    assert (f["wgt_factor_in"].lo, f["wgt_factor_in"].width) == (112, 8)
    with pytest.raises(LoweringError, match="wgt_factor_in=256 does not fit its 8-bit"):
        encode(Gemm(False, 0, 1, 1, 1, 0, 0, 0, 0, 0, 256), VTAConfig(log_block_in=5,
                                                                       log_block_out=5))
    with pytest.raises(ValueError, match="does not fit the Alu instruction"):
        layout(Alu, VTAConfig(log_acc_buff_size=19))


@pytest.mark.parametrize("cls", [Load, Store, Gemm, Alu])
def test_every_overflowing_field_is_named(cls):
    base = {f.name: f for f in layout(cls, DEFAULT)
            if f.name != "opcode" and not f.name.startswith(("pop", "push"))}
    ok = {n: (int(Mem.OUT if cls is Store else Mem.INP) if n == "mem" else
              AluOp.ADD if n == "alu_op" else 0) for n in base}
    for name, f in base.items():
        if f.kind in ("enum", "bool"):
            continue
        too_big = 1 << (f.width - 1) if f.kind == "sint" else 1 << f.width
        for bad in (too_big, -1 - too_big if f.kind == "sint" else -1):
            insn = cls(**{**ok, name: bad})
            with pytest.raises(LoweringError) as e:
                encode(insn)
            msg = str(e.value)
            assert f"field {name}={bad}" in msg and f"{f.width}-bit" in msg
            assert msg.startswith(format_insn(insn).split()[0])


def test_invalid_values_are_rejected():
    with pytest.raises(LoweringError, match="pop_next=2 is not a bool"):
        encode(Finish(Deps(pop_next=2)))
    with pytest.raises(LoweringError, match="x_size=1.5 is not an integer"):
        encode(Load(Mem.INP, 0, 0, 1, 1.5, 1))
    with pytest.raises(LoweringError, match="LOAD into the OUT buffer"):
        encode(Load(Mem.OUT, 0, 0, 1, 1, 1))
    with pytest.raises(LoweringError, match="STORE must use memory type OUT"):
        encode(Store(Mem.ACC, 0, 0, 1, 1, 1))
    with pytest.raises(LoweringError, match="not a valid Mem"):
        Load(9, 0, 0, 1, 1, 1)
    with pytest.raises(LoweringError, match="uop #1 .*field src=2048 does not fit its 11-bit"):
        encode_uops([Uop(0, 0, 0), Uop(0, 2048, 0)])
    with pytest.raises(LoweringError, match="field wgt=-1"):
        encode_uop(Uop(0, 0, -1))


def test_decode_rejects_garbage():
    with pytest.raises(LoweringError, match="invalid opcode 5"):
        decode(5)
    with pytest.raises(LoweringError, match="reserved bits"):
        decode(encode(Finish()) | 1 << 100)
    with pytest.raises(LoweringError, match="reserved bits"):  # ALU bit 7: GEMM's reset
        decode(encode(Alu(0, 1, 1, 1, 0, 0, 0, 0, AluOp.ADD)) | 1 << 7)
    with pytest.raises(LoweringError, match="invalid memory type"):
        decode(encode(Load(Mem.INP, 0, 0, 1, 1, 1)) ^ (int(Mem.INP) ^ int(Mem.OUT)) << 7)
    with pytest.raises(LoweringError, match="reserved bits"):  # this layout uses 28 bits
        decode_uops(np.array([1 << 31], dtype=np.uint32), CONFIGS[2])


def test_format_insn():
    assert format_insn(Load(Mem.INP, 0, 128, 14, 16, 56, 1, 1, 1, 1,
                            Deps(pop_next=True, push_next=True))) == \
        "LOAD  INP sram=0 dram=128 y=14 x=16 stride=56 pad=(1,1,1,1) deps=pop_next,push_next"
    assert format_insn(Gemm(True, 0, 4, 2, 3, 4, 1, 5, 1, 0, 0)) == \
        "GEMM  reset uop=[0,4) iter=(2,3) dst=(4,1) src=(5,1) wgt=(0,0) deps=-"
    assert format_insn(Alu(0, 1, 2, 3, 4, 1, 0, 0, AluOp.SHR, True, -3,
                           Deps(push_next=True))) == \
        "ALU   SHR imm=-3 uop=[0,1) iter=(2,3) dst=(4,1) src=(0,0) deps=push_next"
    assert format_insn(Finish(Deps(pop_next=True))) == "FINISH deps=pop_next"


def test_instructions_are_immutable_values():
    g = Gemm(False, 0, 1, 1, 1, 0, 0, 0, 0, 0, 0)
    with pytest.raises(dataclasses.FrozenInstanceError):
        g.uop_end = 2
    assert Load(Mem.ACC, 0, 0, 1, 1, 1) != Store(Mem.ACC, 0, 0, 1, 1, 1)
    assert Load(3, 0, 0, 1, 1, 1).mem is Mem.ACC
