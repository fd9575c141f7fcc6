"""Bit-exact functional simulator of VTA programs (docs/vta.md §3), driven by the token pipeline
and cycle model of `timing.py`.

Beyond computing results, the simulator is the codegen's checker, so it refuses what hardware
would silently get wrong:
- every scratchpad index and DRAM access is bounds-checked (DRAM: the access must lie inside one
  `DRAM.alloc` block);
- reading a scratchpad entry that no instruction of this run wrote (INP, WGT, ACC, or a uop
  never brought in by LOAD UOP) is an error, because hardware would read stale data;
- data races between modules are errors: a GEMM reading INP/WGT that a LOAD wrote, or a STORE
  reading ACC that compute wrote, must be ordered after the write by tokens (and a write must
  be ordered after earlier reads of the entry by the other module). Checked with vector clocks,
  so the verdict does not depend on the order in which the simulator interleaves modules;
- fields that do not fit the encoding, WGT loads with padding (hardware ignores the pad fields,
  so a nonzero pad means the codegen expected something hardware does not do), UOP loads that
  are not a single row, STOREs with padding.
- the accumulator read-after-write pipeline hazard of vta.md §4: a multiply-accumulate GEMM
  uop writing an ACC entry that one of the two uops before it in the same instruction wrote
  (the pipeline drains between instructions; reset uops only write, so they are exempt);
- FINISH executing while any instruction of any module is not ordered before it by program
  order and tokens (the host reads DRAM when FINISH executes; see `timing.run_pipeline`).
Not checked: races through DRAM (a LOAD reading what a STORE of the same program wrote).

Semantics choices where vta.md leaves room: ALU SHR with a shift >= 32 gives the sign (0 or -1);
a left shift >= 32 gives 0. ALU uops within one instruction take effect in loop order (a later
uop sees an earlier uop's write), as in the reference simulator. Each `run` starts from empty
scratchpads.
"""
from __future__ import annotations

import bisect

import numpy as np

from tsl.backends.vta.config import DEFAULT, VTAConfig
from tsl.backends.vta.isa import (Alu, AluOp, Finish, Gemm, Load, Mem, Store, decode_uops,
                                  elem_bytes, encode, encode_uops, format_insn, layout,
                                  uop_layout)
from tsl.backends.vta.timing import MODULES, Stats, module_of, n_uop_execs, run_pipeline
from tsl.errors import LoweringError

_LOAD, _COMPUTE, _STORE = range(3)  # positions of the modules in a vector clock
_CHUNK = 1 << 18  # uops per vectorised GEMM step: bounds temporary memory


class DRAM:
    """Flat little-endian byte memory with a bump allocator.

    Allocations start at byte 256, so a dram_base left at 0 by mistake faults instead of reading
    the first buffer. Choose `align` as a multiple of the element size of the memory type that
    will address the buffer (256 covers every type of the default configuration)."""

    def __init__(self, nbytes: int | None = None):
        self._mem = np.zeros(max(nbytes or 0, 1 << 16), dtype=np.uint8)
        self._starts: list[int] = []
        self._ends: list[int] = []
        self._top = 256

    def alloc(self, array: np.ndarray | None = None, nbytes: int | None = None,
              align: int = 256) -> int:
        """Reserve `nbytes` (default: the array's size) and copy `array`'s bytes there; returns
        the byte address."""
        data = None
        if array is not None:
            data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
            nbytes = data.size if nbytes is None else nbytes
            if nbytes < data.size:
                raise ValueError(f"DRAM.alloc: nbytes={nbytes} is smaller than the array "
                                 f"({data.size} bytes)")
        if nbytes is None or nbytes <= 0:
            raise ValueError("DRAM.alloc needs an array or a positive nbytes")
        if align <= 0:
            raise ValueError(f"DRAM.alloc: align must be positive, got {align}")
        addr = -(-self._top // align) * align
        end = addr + nbytes
        if end > self._mem.size:
            grown = np.zeros(max(end, 2 * self._mem.size), dtype=np.uint8)
            grown[:self._mem.size] = self._mem
            self._mem = grown
        if data is not None:
            self._mem[addr:addr + data.size] = data
        self._starts.append(addr)
        self._ends.append(end)
        self._top = end
        return addr

    def contains(self, addr: int, nbytes: int) -> bool:
        """Whether [addr, addr + nbytes) lies inside one allocation."""
        k = bisect.bisect_right(self._starts, addr) - 1
        return k >= 0 and addr + nbytes <= self._ends[k]

    def _bytes(self, addr: int, nbytes: int) -> np.ndarray:
        if not self.contains(addr, nbytes):
            raise ValueError(f"DRAM bytes [{addr}, {addr + nbytes}) are not inside one "
                             "allocation")
        return self._mem[addr:addr + nbytes]

    def read(self, addr: int, nbytes: int, dtype, shape) -> np.ndarray:
        dtype = np.dtype(dtype)
        if int(np.prod(shape)) * dtype.itemsize != nbytes:
            raise ValueError(f"DRAM.read: shape {shape} of {dtype} is not {nbytes} bytes")
        return self._bytes(addr, nbytes).view(dtype).reshape(shape).copy()

    def write(self, addr: int, array: np.ndarray):
        data = np.ascontiguousarray(array).reshape(-1).view(np.uint8)
        self._bytes(addr, data.size)[:] = data


def _entry(idx, j: int) -> int:
    """The buffer entry at position j of an index array or slice."""
    return idx.start + j if isinstance(idx, slice) else int(idx[j])


def _wrap32(x: np.ndarray) -> np.ndarray:
    """int32 two's-complement wrap of an int64 array."""
    return (((x + (1 << 31)) & 0xFFFFFFFF) - (1 << 31)).astype(np.int32)


def _alu(op: AluOp, x: np.ndarray, y) -> np.ndarray:
    """x (int64 array) op y (int64 array or Python int), wrapped to int32."""
    if op == AluOp.MIN:
        r = np.minimum(x, y)
    elif op == AluOp.MAX:
        r = np.maximum(x, y)
    elif op == AluOp.ADD:
        r = x + y
    elif op == AluOp.MUL:
        r = x * y
    else:  # SHR; operands are int32-ranged, so >> 31 already yields the sign and << 32 zero
        y = np.asarray(y, dtype=np.int64)
        r = np.where(y >= 0, x >> np.clip(y, 0, 31), x << np.clip(-y, 0, 32))
    return _wrap32(r)


def _alu_segments(dst: np.ndarray, src: np.ndarray | None, depth: int) -> list[tuple[int, int]]:
    """Split an ALU uop sequence into runs that can execute as one vector operation: a run ends
    before the first uop that reads or writes an entry an earlier uop of the run wrote."""
    n = len(dst)
    pos = np.arange(n)
    if np.bincount(dst, minlength=depth).max() <= 1:
        if src is None:
            return [(0, n)]
        first = np.full(depth, n)
        first[dst] = pos
        prev = np.where(first[src] < pos, first[src], -1)
    else:
        # prev[q] = last p < q whose dst is q's dst or src: sort write and read events by
        # (entry, position, read-before-write) and carry the latest write forward per entry.
        reads = [dst] if src is None else [dst, src]
        entry = np.concatenate([dst, *reads])
        where = np.concatenate([pos] * (1 + len(reads)))
        is_write = np.zeros(entry.size, dtype=bool)
        is_write[:n] = True
        order = np.lexsort((is_write, where, entry))
        key = np.where(is_write, entry * (n + 1) + where + 1, -1)[order]
        carried = np.maximum.accumulate(key)
        base = entry[order] * (n + 1)
        last = np.where(carried > base, carried - base - 1, -1)
        prev = np.full(n, -1)
        reader = ~is_write[order]
        np.maximum.at(prev, where[order][reader], last[reader])
    if prev.max() < 0:
        return [(0, n)]
    runs, start = [], 0
    for q, p in enumerate(prev.tolist()):
        if p >= start:
            runs.append((start, q))
            start = q
    runs.append((start, n))
    return runs


class Simulator:
    """Runs programs on one simulated VTA. After `run`, `inp`, `wgt` and `acc` hold the final
    scratchpads (shapes (depth, batch, block_in), (depth, block_out, block_in),
    (depth, batch, block_out)) for inspection."""

    def __init__(self, config: VTAConfig = DEFAULT):
        if (config.inp_width, config.wgt_width, config.acc_width) != (8, 8, 32):
            raise ValueError("the VTA simulator supports int8 inputs and weights with int32 "
                             f"accumulators; got widths inp {config.inp_width}, wgt "
                             f"{config.wgt_width}, acc {config.acc_width}")
        for cls in (Load, Store, Gemm, Alu, Finish):
            layout(cls, config)  # raises if the configuration does not fit the ISA
        uop_layout(config)
        self.config = config
        # Products of int8 are at most 2**14; float32 sums stay exact below 2**24.
        self._dtype = np.float32 if config.block_in <= 1 << 10 else np.float64
        self._reset()

    def _reset(self):
        c = self.config
        self.inp = np.zeros((c.inp_depth, c.batch, c.block_in), dtype=np.int8)
        self.wgt = np.zeros((c.wgt_depth, c.block_out, c.block_in), dtype=np.int8)
        self.acc = np.zeros((c.acc_depth, c.batch, c.block_out), dtype=np.int32)
        self._uop = np.zeros((c.uop_depth, 3), dtype=np.int64)
        self._uop_ok = np.zeros(c.uop_depth, dtype=bool)
        # Per entry, the 1-based position within its module of the last writer / last reader
        # from the other module (0: none); compared against vector clocks.
        self._inp_w = np.zeros(c.inp_depth, dtype=np.int64)
        self._inp_r = np.zeros(c.inp_depth, dtype=np.int64)
        self._wgt_w = np.zeros(c.wgt_depth, dtype=np.int64)
        self._wgt_r = np.zeros(c.wgt_depth, dtype=np.int64)
        self._acc_w = np.zeros(c.acc_depth, dtype=np.int64)
        self._acc_r = np.zeros(c.acc_depth, dtype=np.int64)

    def run(self, program: list, uops, dram: DRAM, uop_dram_addr: int | None = None,
            max_steps: int = 200_000_000) -> Stats:
        """Execute `program` (ending with FINISH) against `dram`.

        Micro-ops: with `uop_dram_addr` None, `uops` (list of Uop, (n, 3) array of dst, src,
        wgt, or 1-D array of uop words) is a separate uop segment and LOAD UOP's dram_base
        indexes it. With `uop_dram_addr` given, LOAD UOP's dram_base is an absolute DRAM
        element index (4-byte units) like any other load; `uops`, if not None, is first
        written at that byte address (which must lie in an allocation).
        `max_steps` caps the total GEMM + ALU uop executions, to stop runaway loop counts."""
        c = self.config
        for k, insn in enumerate(program):
            try:
                encode(insn, c)
            except LoweringError as e:
                raise LoweringError(f"instruction #{k}: {e}") from None
        words = None
        if isinstance(uops, np.ndarray) and uops.ndim == 1:
            if uops.dtype != np.uint32:
                raise ValueError(f"a 1-D uops array must hold uint32 uop words, got {uops.dtype}")
            words = uops
        elif uops is not None:
            words = encode_uops(uops, c)
        if uop_dram_addr is not None:
            if uop_dram_addr % c.uop_bytes:
                raise ValueError(f"uop_dram_addr {uop_dram_addr} is not 4-byte aligned")
            if words is not None:
                dram.write(uop_dram_addr, words.astype("<u4"))
            words = None
        self._reset()
        self._program = program
        self._dram = dram
        self._uop_words = words
        self._uop_in_dram = uop_dram_addr is not None
        self._steps_left = max_steps
        self._index_of = {m: [] for m in MODULES}
        for k, insn in enumerate(program):
            self._index_of[module_of(insn)].append(k)
        return run_pipeline(program, c, self._execute)

    # -- helpers ------------------------------------------------------------------------------
    def _fail(self, k: int, insn, msg: str):
        raise LoweringError(f"instruction #{k} ({format_insn(insn)}): {msg}")

    def _who(self, module: int, seq: int) -> str:
        j = self._index_of[MODULES[module]][seq - 1]
        return f"#{j} ({format_insn(self._program[j])})"

    def _check_read(self, k, insn, vc, buf: str, idx, written, writer: int):
        """idx entries of `buf` are read: each must have been written, by an instruction
        ordered before this one (the writer module is `writer`)."""
        w = written[idx]
        if w.size == 0:
            return
        if w.min() == 0:
            e = _entry(idx, int(np.argmin(w)))
            self._fail(k, insn, f"reads {buf} entry {e}, which no instruction of this program "
                                "wrote")
        if w.max() > vc[writer]:
            j = int(np.argmax(w))
            e = _entry(idx, j)
            self._fail(k, insn, f"race: reads {buf} entry {e} written by "
                                f"{self._who(writer, int(w[j]))}, and no token orders that "
                                "write before this read")

    def _check_overwrite(self, k, insn, vc, buf: str, idx, read, reader: int):
        """idx entries of `buf` are written: earlier reads by module `reader` must be ordered
        before this write."""
        r = read[idx]
        if r.size and r.max() > vc[reader]:
            j = int(np.argmax(r))
            e = _entry(idx, j)
            self._fail(k, insn, f"race: overwrites {buf} entry {e} read by "
                                f"{self._who(reader, int(r[j]))}, and no token orders that "
                                "read before this write")

    def _sram_range(self, k, insn, buf: str, base: int, n: int, depth: int) -> slice:
        if base + n > depth:
            self._fail(k, insn, f"{buf} entries [{base}, {base + n}) exceed the buffer depth "
                                f"{depth}")
        return slice(base, base + n)

    def _dram_rows(self, k, insn, ebytes: int):
        """(row element indices, the DRAM bytes of the access as (elements, ebytes))."""
        span = (insn.y_size - 1) * insn.x_stride + insn.x_size if insn.y_size else 0
        lo = insn.dram_base * ebytes
        if not self._dram.contains(lo, span * ebytes):
            self._fail(k, insn, f"DRAM bytes [{lo}, {lo + span * ebytes}) (elements "
                                f"[{insn.dram_base}, {insn.dram_base + span}) of {ebytes} "
                                "bytes) are not inside one allocation")
        rows = (np.arange(insn.y_size)[:, None] * insn.x_stride
                + np.arange(insn.x_size)[None, :]).ravel()
        return rows, self._dram._mem[lo:lo + span * ebytes].reshape(span, ebytes)

    def _loop_index(self, k, insn, base: np.ndarray, f_out: int, f_in: int, depth: int,
                    buf: str) -> np.ndarray:
        """Indices of one operand over the loop nest, in execution order (y, x, uop)."""
        lo = int(base.min())
        hi = int(base.max()) + (insn.iter_out - 1) * f_out + (insn.iter_in - 1) * f_in
        if hi >= depth:
            self._fail(k, insn, f"{buf} indices reach [{lo}, {hi}], past the buffer depth "
                                f"{depth}")
        off = (np.arange(insn.iter_out)[:, None] * f_out
               + np.arange(insn.iter_in)[None, :] * f_in).ravel()
        return (off[:, None] + base[None, :]).ravel()

    def _loop_uops(self, k, insn) -> np.ndarray:
        b, e = insn.uop_bgn, insn.uop_end
        if e > self.config.uop_depth:
            self._fail(k, insn, f"uop range [{b}, {e}) exceeds the UOP buffer depth "
                                f"{self.config.uop_depth}")
        ok = self._uop_ok[b:e]
        if not ok.all():
            self._fail(k, insn, f"uop {b + int(np.argmin(ok))} was never loaded by LOAD UOP")
        n = n_uop_execs(insn)
        if n > self._steps_left:
            self._fail(k, insn, f"{n} uop executions exceed the remaining max_steps budget "
                                f"({self._steps_left})")
        self._steps_left -= n
        return self._uop[b:e]

    # -- instructions -------------------------------------------------------------------------
    def _execute(self, k: int, insn, vc: tuple):
        if isinstance(insn, Load):
            if insn.mem == Mem.UOP:
                self._load_uop(k, insn)
            else:
                self._load(k, insn, vc)
        elif isinstance(insn, Store):
            self._store(k, insn, vc)
        elif isinstance(insn, Gemm):
            self._gemm(k, insn, vc)
        elif isinstance(insn, Alu):
            self._alu(k, insn, vc)

    def _load_uop(self, k, insn):
        if insn.x_size == 0:
            return
        if insn.y_size != 1 or insn.y_pad0 or insn.y_pad1 or insn.x_pad0 or insn.x_pad1:
            self._fail(k, insn, "a UOP load is a 1-D copy: y_size must be 1 and padding 0")
        rng = self._sram_range(k, insn, "UOP", insn.sram_base, insn.x_size,
                               self.config.uop_depth)
        if self._uop_in_dram:
            _, data = self._dram_rows(k, insn, 4)
            words = data.reshape(-1).view("<u4")
        else:
            have = 0 if self._uop_words is None else len(self._uop_words)
            if insn.dram_base + insn.x_size > have:
                self._fail(k, insn, f"uop segment elements [{insn.dram_base}, "
                                    f"{insn.dram_base + insn.x_size}) past the {have} uops "
                                    "given to run()")
            words = self._uop_words[insn.dram_base:insn.dram_base + insn.x_size]
        try:
            self._uop[rng] = decode_uops(words, self.config)
        except LoweringError as e:
            self._fail(k, insn, str(e))
        self._uop_ok[rng] = True

    def _load(self, k, insn, vc):
        c = self.config
        mem = insn.mem
        if insn.x_size == 0:
            return
        if mem == Mem.WGT and (insn.y_pad0 or insn.y_pad1 or insn.x_pad0 or insn.x_pad1):
            self._fail(k, insn, "WGT loads cannot pad (hardware ignores the pad fields)")
        rows = insn.y_pad0 + insn.y_size + insn.y_pad1
        cols = insn.x_pad0 + insn.x_size + insn.x_pad1
        if mem == Mem.INP:
            buf, depth, shape = self.inp, c.inp_depth, (c.batch, c.block_in)
        elif mem == Mem.WGT:
            buf, depth, shape = self.wgt, c.wgt_depth, (c.block_out, c.block_in)
        else:
            buf, depth, shape = self.acc, c.acc_depth, (c.batch, c.block_out)
        name = "ACC" if mem == Mem.ACC_8BIT else mem.name
        rng = self._sram_range(k, insn, name, insn.sram_base, rows * cols, depth)
        idx, data = self._dram_rows(k, insn, elem_bytes(mem, c))
        elems = data[idx]
        if mem in (Mem.INP, Mem.WGT, Mem.ACC_8BIT):
            vals = elems.view(np.int8)
        else:
            vals = elems.view("<i4")
        vals = vals.reshape(insn.y_size, insn.x_size, *shape)
        if mem in (Mem.INP, Mem.WGT):
            read, written, me = ((self._inp_r, self._inp_w, vc[_LOAD]) if mem == Mem.INP
                                 else (self._wgt_r, self._wgt_w, vc[_LOAD]))
            self._check_overwrite(k, insn, vc, name, rng, read, _COMPUTE)
        else:
            read, written, me = self._acc_r, self._acc_w, vc[_COMPUTE]
            self._check_overwrite(k, insn, vc, name, rng, read, _STORE)
        block = buf[rng].reshape(rows, cols, *shape)
        block[...] = 0
        block[insn.y_pad0:insn.y_pad0 + insn.y_size, insn.x_pad0:insn.x_pad0 + insn.x_size] = vals
        written[rng] = me

    def _store(self, k, insn, vc):
        c = self.config
        if insn.x_size == 0:
            return
        if insn.y_pad0 or insn.y_pad1 or insn.x_pad0 or insn.x_pad1:
            self._fail(k, insn, "STORE cannot pad")
        rng = self._sram_range(k, insn, "OUT", insn.sram_base, insn.y_size * insn.x_size,
                               min(c.acc_depth, c.out_depth))
        self._check_read(k, insn, vc, "ACC", rng, self._acc_w, _COMPUTE)
        low = (self.acc[rng] & 0xFF).astype(np.uint8)
        idx, data = self._dram_rows(k, insn, c.out_entry_bytes)
        data[idx] = low.reshape(len(idx), c.out_entry_bytes)
        self._acc_r[rng] = vc[_STORE]

    def _gemm(self, k, insn, vc):
        c = self.config
        if n_uop_execs(insn) == 0:
            return
        u = self._loop_uops(k, insn)
        a = self._loop_index(k, insn, u[:, 0], insn.dst_factor_out, insn.dst_factor_in,
                             c.acc_depth, "ACC")
        self._check_overwrite(k, insn, vc, "ACC", a, self._acc_r, _STORE)
        if insn.reset:
            self.acc[a] = 0
            self._acc_w[a] = vc[_COMPUTE]
            return
        self._check_acc_hazard(k, insn, a)
        i = self._loop_index(k, insn, u[:, 1], insn.src_factor_out, insn.src_factor_in,
                             c.inp_depth, "INP")
        w = self._loop_index(k, insn, u[:, 2], insn.wgt_factor_out, insn.wgt_factor_in,
                             c.wgt_depth, "WGT")
        self._check_read(k, insn, vc, "INP", i, self._inp_w, _LOAD)
        self._check_read(k, insn, vc, "WGT", w, self._wgt_w, _LOAD)
        self._check_read(k, insn, vc, "ACC", a, self._acc_w, _COMPUTE)
        self._accumulate(a, i, w)
        self._inp_r[i] = vc[_COMPUTE]
        self._wgt_r[w] = vc[_COMPUTE]
        self._acc_w[a] = vc[_COMPUTE]

    def _check_acc_hazard(self, k, insn, a: np.ndarray):
        """A multiply-accumulate uop may not write an ACC entry that one of the two uops before
        it (in execution order, within the instruction) wrote: the pipeline reads the entry
        before that write lands (docs/vta.md §4), so hardware would lose a partial sum."""
        hits = [np.flatnonzero(a[d:] == a[:-d]) + d for d in (1, 2) if a.size > d]
        hits = [h[0] for h in hits if h.size]
        if not hits:
            return
        q = int(min(hits))
        d = 1 if a[q] == a[q - 1] else 2
        n = insn.uop_end - insn.uop_bgn
        y, rest = divmod(q, insn.iter_in * n)
        x, uop = divmod(rest, n)
        self._fail(k, insn, f"accumulator hazard: uop execution {q} (iter_out {y}, iter_in {x}, "
                            f"uop {insn.uop_bgn + uop}) writes ACC entry {int(a[q])}, which "
                            f"the uop {d} before it wrote; a GEMM uop may not write an entry "
                            "either of the two previous uops wrote (docs/vta.md §4)")

    def _accumulate(self, a, i, w):
        """ACC[a] += INP[i] . WGT[w]^T for every uop. int32 wrapping addition is addition mod
        2**32, so the sum per ACC entry does not depend on uop order and duplicates in `a`
        are summed exactly. Products come either from a table of every (INP, WGT) pair in the
        touched ranges, one BLAS matmul, when that table is small, or from per-uop gathers."""
        c = self.config
        bo, k_in, dt = c.batch * c.block_out, c.block_in, self._dtype
        ilo, wlo, alo = int(i.min()), int(w.min()), int(a.min())
        n_i, n_w, n_a = int(i.max()) - ilo + 1, int(w.max()) - wlo + 1, int(a.max()) - alo + 1
        table = None
        if n_i * n_w <= max(4 * a.size, 4096) and n_i * n_w * bo <= 1 << 24:
            x = self.inp[ilo:ilo + n_i].reshape(n_i * c.batch, k_in).astype(dt)
            m = self.wgt[wlo:wlo + n_w].reshape(n_w * c.block_out, k_in).astype(dt)
            table = ((x @ m.T).reshape(n_i, c.batch, n_w, c.block_out)
                     .transpose(0, 2, 1, 3).reshape(n_i * n_w, bo))
        sums = np.zeros((n_a, bo), dtype=np.float64)
        for s in range(0, a.size, _CHUNK):
            e = min(a.size, s + _CHUNK)
            if table is not None:
                vals = table[(i[s:e] - ilo) * n_w + (w[s:e] - wlo)]
            else:
                vals = np.matmul(self.inp[i[s:e]].astype(dt),
                                 self.wgt[w[s:e]].astype(dt).transpose(0, 2, 1)).reshape(-1, bo)
            rel = a[s:e] - alo
            for lane in range(bo):
                sums[:, lane] += np.bincount(rel, weights=vals[:, lane], minlength=n_a)
        target = self.acc[alo:alo + n_a].reshape(n_a, bo)
        target[...] = _wrap32(target.astype(np.int64) + sums.astype(np.int64))

    def _alu(self, k, insn, vc):
        c = self.config
        if n_uop_execs(insn) == 0:
            return
        u = self._loop_uops(k, insn)
        d = self._loop_index(k, insn, u[:, 0], insn.dst_factor_out, insn.dst_factor_in,
                             c.acc_depth, "ACC")
        s = None
        if not insn.use_imm:
            s = self._loop_index(k, insn, u[:, 1], insn.src_factor_out, insn.src_factor_in,
                                 c.acc_depth, "ACC")
            self._check_read(k, insn, vc, "ACC", s, self._acc_w, _COMPUTE)
        self._check_read(k, insn, vc, "ACC", d, self._acc_w, _COMPUTE)
        self._check_overwrite(k, insn, vc, "ACC", d, self._acc_r, _STORE)
        for lo, hi in _alu_segments(d, s, c.acc_depth):
            x = self.acc[d[lo:hi]].astype(np.int64)
            y = insn.imm if insn.use_imm else self.acc[s[lo:hi]].astype(np.int64)
            self.acc[d[lo:hi]] = _alu(insn.alu_op, x, y)
        self._acc_w[d] = vc[_COMPUTE]
