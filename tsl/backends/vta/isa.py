"""VTA instructions and micro-ops: dataclasses, the 128-bit / 32-bit encodings, and a printer.

The bit layout is a function of the configuration, computed the way VTA's `hw_spec.h` does:
fields are packed from bit 0 in a fixed order, index and factor fields are log2(depth) of the
buffer they address (uop_end one bit wider, so that it can equal the depth), loop counts are 14
bits, and a field that would straddle bit 64 starts at bit 64 instead. For the default
configuration this gives exactly the layout of docs/vta.md §2. A value that does not fit its
field raises `LoweringError` instead of wrapping, because a wrapped address silently computes
on the wrong data.

Decoding rejects set bits outside every field, so decode(encode(x)) == x and
encode(decode(w)) == w both hold.
"""
from __future__ import annotations

import functools
import operator
from dataclasses import dataclass, fields
from enum import IntEnum

import numpy as np

from tsl.backends.vta.config import DEFAULT, VTAConfig
from tsl.errors import LoweringError


class Op(IntEnum):
    LOAD = 0
    STORE = 1
    GEMM = 2
    FINISH = 3
    ALU = 4


class Mem(IntEnum):
    UOP = 0
    WGT = 1
    INP = 2
    ACC = 3
    OUT = 4
    ACC_8BIT = 5


class AluOp(IntEnum):
    MIN = 0
    MAX = 1
    ADD = 2
    SHR = 3
    MUL = 4


@dataclass(frozen=True)
class Deps:
    pop_prev: bool = False
    pop_next: bool = False
    push_prev: bool = False
    push_next: bool = False

    def names(self) -> list[str]:
        return [f.name for f in fields(self) if getattr(self, f.name)]


_NO_DEPS = Deps()


def _as_enum(enum, value, what):
    try:
        return enum(value)
    except ValueError:
        raise LoweringError(f"{what}: {value!r} is not a valid {enum.__name__} "
                            f"({', '.join(f'{e.name}={e.value}' for e in enum)})") from None


@dataclass(frozen=True)
class _Dma:
    mem: Mem
    sram_base: int
    dram_base: int
    y_size: int
    x_size: int
    x_stride: int
    y_pad0: int = 0
    y_pad1: int = 0
    x_pad0: int = 0
    x_pad1: int = 0
    deps: Deps = _NO_DEPS

    def __post_init__(self):
        object.__setattr__(self, "mem", _as_enum(Mem, self.mem, f"{type(self).__name__}.mem"))


@dataclass(frozen=True)
class Load(_Dma):
    """DRAM -> scratchpad 2-D strided copy with zero padding (any memory type but OUT)."""


@dataclass(frozen=True)
class Store(_Dma):
    """Scratchpad -> DRAM copy; the memory type is always OUT."""


@dataclass(frozen=True)
class Gemm:
    reset: bool
    uop_bgn: int
    uop_end: int
    iter_out: int
    iter_in: int
    dst_factor_out: int
    dst_factor_in: int
    src_factor_out: int
    src_factor_in: int
    wgt_factor_out: int
    wgt_factor_in: int
    deps: Deps = _NO_DEPS


@dataclass(frozen=True)
class Alu:
    uop_bgn: int
    uop_end: int
    iter_out: int
    iter_in: int
    dst_factor_out: int
    dst_factor_in: int
    src_factor_out: int
    src_factor_in: int
    alu_op: AluOp
    use_imm: bool = False
    imm: int = 0
    deps: Deps = _NO_DEPS

    def __post_init__(self):
        object.__setattr__(self, "alu_op", _as_enum(AluOp, self.alu_op, "Alu.alu_op"))


@dataclass(frozen=True)
class Finish:
    deps: Deps = _NO_DEPS


@dataclass(frozen=True)
class Uop:
    dst: int
    src: int
    wgt: int = 0


Insn = Load | Store | Gemm | Alu | Finish

_OPCODE = {Load: Op.LOAD, Store: Op.STORE, Gemm: Op.GEMM, Alu: Op.ALU, Finish: Op.FINISH}
_CLASS_BY_CODE = {int(op): cls for cls, op in _OPCODE.items()}

_LOOP_ITER_BITS = 14  # VTA_LOOP_ITER_WIDTH


def elem_bytes(mem: Mem, config: VTAConfig = DEFAULT) -> int:
    """Bytes of one DRAM element of `mem`: the unit of dram_base and x_stride."""
    return {Mem.UOP: config.uop_bytes, Mem.INP: config.inp_entry_bytes,
            Mem.WGT: config.wgt_entry_bytes, Mem.ACC: config.acc_entry_bytes,
            Mem.OUT: config.out_entry_bytes,
            Mem.ACC_8BIT: config.batch * config.block_out}[Mem(mem)]


# -- layout ---------------------------------------------------------------------------------
@dataclass(frozen=True)
class Field:
    name: str  # attribute of the instruction; "" for reserved bits that must be zero
    lo: int
    width: int
    kind: str  # "uint", "bool", "sint", "enum"


def _place(spec, total, what):
    """Pack (name, width, kind) from bit 0, moving a field that would straddle a 64-bit word
    boundary to the next word (VTA's instruction structs never straddle the two words)."""
    out, pos = [], 0
    for name, width, kind in spec:
        if pos // 64 != (pos + width - 1) // 64:
            pos = (pos // 64 + 1) * 64
        out.append(Field(name, pos, width, kind))
        pos += width
    if pos > total:
        raise ValueError(f"VTA configuration does not fit the {what} in {total} bits "
                         f"(needs {pos}): reduce the buffer depths")
    return tuple(f for f in out if f.name)


_HEADER = [("opcode", 3, "uint"), ("pop_prev", 1, "bool"), ("pop_next", 1, "bool"),
           ("push_prev", 1, "bool"), ("push_next", 1, "bool")]


@functools.lru_cache(maxsize=None)
def layout(cls, config: VTAConfig = DEFAULT) -> tuple[Field, ...]:
    """Fields of instruction class `cls` under `config`, header included."""
    c = config
    u, i, w, a = c.log_uop_depth, c.log_inp_depth, c.log_wgt_depth, c.log_acc_depth
    loop = [("uop_bgn", u, "uint"), ("uop_end", u + 1, "uint"),
            ("iter_out", _LOOP_ITER_BITS, "uint"), ("iter_in", _LOOP_ITER_BITS, "uint"),
            ("dst_factor_out", a, "uint"), ("dst_factor_in", a, "uint"),
            ("src_factor_out", i, "uint"), ("src_factor_in", i, "uint")]
    body = {
        Load: [("mem", 3, "enum"), ("sram_base", 16, "uint"), ("dram_base", 32, "uint"),
               ("y_size", 16, "uint"), ("x_size", 16, "uint"), ("x_stride", 16, "uint"),
               ("y_pad0", 4, "uint"), ("y_pad1", 4, "uint"), ("x_pad0", 4, "uint"),
               ("x_pad1", 4, "uint")],
        Gemm: [("reset", 1, "bool"), *loop, ("wgt_factor_out", w, "uint"),
               ("wgt_factor_in", w, "uint")],
        # Bit 7 is GEMM's reset bit; ALU leaves it reserved.
        Alu: [("", 1, "uint"), *loop, ("alu_op", 3, "enum"), ("use_imm", 1, "bool"),
              ("imm", 16, "sint")],
        Finish: [],
    }[Load if cls is Store else cls]
    return _place(_HEADER + body, 128, f"{cls.__name__} instruction")


@functools.lru_cache(maxsize=None)
def uop_layout(config: VTAConfig = DEFAULT) -> tuple[Field, ...]:
    """dst indexes ACC, wgt indexes WGT; src is log2(INP depth) bits wide even though ALU uops
    use it to index ACC (as VTAUop in hw_spec.h)."""
    return _place([("dst", config.log_acc_depth, "uint"), ("src", config.log_inp_depth, "uint"),
                   ("wgt", config.log_wgt_depth, "uint")], 32, "micro-op")


def _mask(f: Field) -> int:
    return ((1 << f.width) - 1) << f.lo


@functools.lru_cache(maxsize=None)
def _used_mask(cls, config: VTAConfig) -> int:
    m = 0
    for f in layout(cls, config):
        m |= _mask(f)
    return m


# -- encoding -------------------------------------------------------------------------------
def _field_value(insn, f: Field):
    if f.name == "opcode":
        return int(_OPCODE[type(insn)])
    if f.name in ("pop_prev", "pop_next", "push_prev", "push_next"):
        return getattr(insn.deps, f.name)
    return getattr(insn, f.name)


def _check(value, f: Field) -> int:
    """The field's raw bits for `value`, or LoweringError naming the field, value and width."""
    if f.kind == "bool":
        if value in (0, 1) and isinstance(value, (bool, int, np.integer)):
            return int(value)
        raise LoweringError(f"field {f.name}={value!r} is not a bool (1-bit field)")
    try:
        v = operator.index(value)
    except TypeError:
        raise LoweringError(f"field {f.name}={value!r} is not an integer "
                            f"({f.width}-bit field)") from None
    if f.kind == "sint":
        lo, hi = -(1 << (f.width - 1)), (1 << (f.width - 1)) - 1
        if not lo <= v <= hi:
            raise LoweringError(f"field {f.name}={v} does not fit its {f.width}-bit "
                                f"signed field [{lo}, {hi}]")
        return v & ((1 << f.width) - 1)
    if not 0 <= v < (1 << f.width):
        raise LoweringError(f"field {f.name}={v} does not fit its {f.width}-bit "
                            f"unsigned field [0, {(1 << f.width) - 1}]")
    return v


def encode(insn: Insn, config: VTAConfig = DEFAULT) -> int:
    """The instruction as a 128-bit integer (bit 0 = LSB of the low 64-bit word)."""
    cls = type(insn)
    if cls not in _OPCODE:
        raise LoweringError(f"{insn!r} is not a VTA instruction")
    if cls is Load and insn.mem == Mem.OUT:
        raise LoweringError(f"{format_insn(insn)}: LOAD into the OUT buffer does not exist")
    if cls is Store and insn.mem != Mem.OUT:
        raise LoweringError(f"{format_insn(insn)}: STORE must use memory type OUT "
                            f"(got {insn.mem.name})")
    word = 0
    for f in layout(cls, config):
        value = _field_value(insn, f)
        try:
            word |= _check(value, f) << f.lo
        except LoweringError as e:
            raise LoweringError(f"{format_insn(insn)}: {e}") from None
    return word


def decode(word: int, config: VTAConfig = DEFAULT):
    """The instruction encoded by the 128-bit integer `word`."""
    word = operator.index(word)
    if not 0 <= word < (1 << 128):
        raise LoweringError(f"instruction word {word:#x} is not a 128-bit unsigned integer")
    op = word & 7
    if op not in _CLASS_BY_CODE:
        raise LoweringError(f"instruction word {word:#034x}: invalid opcode {op}")
    cls = _CLASS_BY_CODE[op]
    stray = word & ~_used_mask(cls, config)
    if stray:
        raise LoweringError(f"instruction word {word:#034x} ({cls.__name__}): reserved bits "
                            f"{stray:#x} are set")
    values, deps = {}, {}
    for f in layout(cls, config):
        raw = (word >> f.lo) & ((1 << f.width) - 1)
        if f.kind == "bool":
            raw = bool(raw)
        elif f.kind == "sint" and raw >> (f.width - 1):
            raw -= 1 << f.width
        if f.name == "opcode":
            continue
        if f.name in ("pop_prev", "pop_next", "push_prev", "push_next"):
            deps[f.name] = raw
        else:
            values[f.name] = raw
    insn = cls(**values, deps=Deps(**deps))
    if (cls is Load and insn.mem == Mem.OUT) or (cls is Store and insn.mem != Mem.OUT):
        raise LoweringError(f"instruction word {word:#034x}: {format_insn(insn)} uses an "
                            "invalid memory type for its opcode")
    return insn


def to_words(program, config: VTAConfig = DEFAULT) -> np.ndarray:
    """The program as a (n, 2) uint64 array of (low, high) 64-bit words, as VTA fetches it."""
    out = np.empty((len(program), 2), dtype=np.uint64)
    mask = (1 << 64) - 1
    for k, insn in enumerate(program):
        w = encode(insn, config)
        out[k, 0], out[k, 1] = w & mask, w >> 64
    return out


def from_words(words: np.ndarray, config: VTAConfig = DEFAULT) -> list:
    words = np.asarray(words, dtype=np.uint64).reshape(-1, 2)
    return [decode(int(lo) | (int(hi) << 64), config) for lo, hi in words]


# -- micro-ops ------------------------------------------------------------------------------
def encode_uop(u: Uop, config: VTAConfig = DEFAULT) -> int:
    word = 0
    for f in uop_layout(config):
        try:
            word |= _check(getattr(u, f.name), f) << f.lo
        except LoweringError as e:
            raise LoweringError(f"{u}: {e}") from None
    return word


def decode_uop(word: int, config: VTAConfig = DEFAULT) -> Uop:
    return Uop(*(int(v) for v in decode_uops(np.array([word], dtype=np.uint32), config)[0]))


def uop_array(uops) -> np.ndarray:
    """(n, 3) int64 array of (dst, src, wgt) from a list of Uop or an (n, 3) array."""
    if isinstance(uops, np.ndarray):
        arr = uops.astype(np.int64).reshape(-1, 3)
    else:
        arr = np.array([(u.dst, u.src, u.wgt) for u in uops], dtype=np.int64).reshape(-1, 3)
    return arr


def encode_uops(uops, config: VTAConfig = DEFAULT) -> np.ndarray:
    """uint32 words of a list of Uop (or an (n, 3) array of dst, src, wgt); what the caller
    stores in DRAM for LOAD UOP."""
    arr = uop_array(uops)
    words = np.zeros(len(arr), dtype=np.uint64)
    for col, f in enumerate(uop_layout(config)):
        v = arr[:, col]
        bad = np.flatnonzero((v < 0) | (v >= (1 << f.width)))
        if bad.size:
            k = int(bad[0])
            raise LoweringError(f"uop #{k} (dst={arr[k, 0]}, src={arr[k, 1]}, wgt={arr[k, 2]}): "
                                f"field {f.name}={v[k]} does not fit its {f.width}-bit unsigned "
                                f"field [0, {(1 << f.width) - 1}]")
        words |= v.astype(np.uint64) << np.uint64(f.lo)
    return words.astype(np.uint32)


def decode_uops(words: np.ndarray, config: VTAConfig = DEFAULT) -> np.ndarray:
    """(n, 3) int64 array of (dst, src, wgt) from uint32 uop words."""
    w = np.asarray(words).astype(np.uint64).ravel()
    used = 0
    cols = []
    for f in uop_layout(config):
        used |= _mask(f)
        cols.append(((w >> np.uint64(f.lo)) & np.uint64((1 << f.width) - 1)).astype(np.int64))
    stray = np.flatnonzero(w & np.uint64(~used & 0xFFFFFFFF))
    if stray.size:
        raise LoweringError(f"uop word #{int(stray[0])} ({int(w[stray[0]]):#010x}) has reserved "
                            "bits set")
    return np.stack(cols, axis=1) if cols else np.zeros((len(w), 3), np.int64)


# -- printing -------------------------------------------------------------------------------
def _deps_text(deps: Deps) -> str:
    return ",".join(deps.names()) or "-"


def format_insn(insn: Insn) -> str:
    """One readable line per instruction (used in every error message)."""
    if isinstance(insn, _Dma):
        name = "LOAD" if isinstance(insn, Load) else "STORE"
        mem = insn.mem.name if isinstance(insn.mem, Mem) else str(insn.mem)
        return (f"{name:<5} {mem} sram={insn.sram_base} dram={insn.dram_base} y={insn.y_size} "
                f"x={insn.x_size} stride={insn.x_stride} "
                f"pad=({insn.y_pad0},{insn.y_pad1},{insn.x_pad0},{insn.x_pad1}) "
                f"deps={_deps_text(insn.deps)}")
    if isinstance(insn, (Gemm, Alu)):
        loop = (f"uop=[{insn.uop_bgn},{insn.uop_end}) iter=({insn.iter_out},{insn.iter_in}) "
                f"dst=({insn.dst_factor_out},{insn.dst_factor_in}) "
                f"src=({insn.src_factor_out},{insn.src_factor_in})")
        if isinstance(insn, Gemm):
            return (f"GEMM  {'reset ' if insn.reset else ''}{loop} "
                    f"wgt=({insn.wgt_factor_out},{insn.wgt_factor_in}) "
                    f"deps={_deps_text(insn.deps)}")
        operand = f"imm={insn.imm}" if insn.use_imm else "src"
        return f"ALU   {insn.alu_op.name} {operand} {loop} deps={_deps_text(insn.deps)}"
    if isinstance(insn, Finish):
        return f"FINISH deps={_deps_text(insn.deps)}"
    return repr(insn)
