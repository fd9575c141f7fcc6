"""The TSL schedule: primitives recorded against TAM roles, checked against the machine.

A `Schedule` is made for one operator and one machine. A schedule function calls its primitives;
each one validates its arguments up front and records a step. Nothing is lowered while the
function runs: `tsl.lower` replays the recorded steps on a `tvm.s_tir.Schedule` afterwards, with
the concrete scopes, bindings and tensor intrinsics that the back end supplies. Loops are named
after the operator axis they come from: splitting `i` gives `i.0`, `i.1`, ...

Every error is a `ScheduleError` of the form ``<primitive>(<args>): <what is wrong>; <what to
change>``.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, replace

from ..errors import ScheduleError
from ..ops.operator import Operator
from ..tam.capabilities import Capabilities, of as capabilities_of
from ..tam.machine import Machine, MemoryLevel, TensorPrimitive, dtype_bytes

OPERAND_ROLES = {"A": ("b", "m", "k"), "B": ("b", "n", "k"), "C": ("b", "m", "n")}


@dataclass(eq=False)
class Loop:
    """One loop of the scheduled nest: `extent` iterations of `step` elements of `axis`
    (a fused loop has several axes)."""

    name: str
    axes: tuple[str, ...]
    extent: int
    step: int = 1
    parts: tuple["Loop", ...] = ()  # the loops a fused loop was made of
    parallel: str | None = None  # compute level name
    split: bool = False  # a reduction loop whose iterations accumulate partial sums
    tensorized: TensorPrimitive | None = None
    stages: int = 1

    @property
    def span(self) -> int:
        return self.extent * self.step

    def __repr__(self) -> str:
        return f"Loop({self.name}, extent={self.extent})"


@dataclass(frozen=True)
class Stage:
    """An operand tile staged in a memory level at a loop (the result of `cache`)."""

    operand: str
    level: MemoryLevel
    at: Loop
    elements: int
    dtype: str

    @property
    def bytes(self) -> int:
        return math.ceil(self.elements * dtype_bytes(self.dtype))


def _named(arg):
    """A step's argument with each loop as {"loop": name} (JSON, and no live Loop)."""
    if isinstance(arg, Loop):
        return {"loop": arg.name}
    if isinstance(arg, (list, tuple)):
        return [_named(a) for a in arg]
    return arg


@dataclass(frozen=True)
class Step:
    primitive: str
    args: tuple
    result: tuple = ()

    def __str__(self) -> str:
        def show(a):
            if isinstance(a, Loop):
                return a.name
            if isinstance(a, (list, tuple)):
                return "[" + ", ".join(show(x) for x in a) + "]"
            return repr(a)
        out = f"{self.primitive}({', '.join(show(a) for a in self.args)})"
        return out + (f" -> {show(self.result)}" if self.result else "")


class Schedule:
    """Records a TSL schedule of `op` on `machine`.

    `knobs` fixes tunable values by name (see `knob`); the others take their defaults.
    """

    def __init__(self, op: Operator, machine: Machine, knobs: dict | None = None):
        self.op = op
        self.machine = machine
        if knobs is not None and not isinstance(knobs, dict):
            raise ScheduleError(f"knobs must be a dict of knob name -> value, got {knobs!r}")
        self.knob_values = dict(knobs or {})
        self._given = tuple(self.knob_values)  # checked against the declared knobs in validate
        self.space: dict[str, tuple] = {}
        self.refining: set[str] = set()  # knobs declared with refines=True
        self.steps: list[Step] = []
        self.stages: list[Stage] = []
        self.epilogue_at: Loop | None = None
        self.packed: dict[str, str] = {}
        # The user gave the schedule function or knob values (tsl.build sets it): a back end
        # with its own kernel for the operator (sm_90a wgmma) builds such a schedule as written.
        self.as_written = False
        self.loops: list[Loop] = [Loop(a.name, (a.name,), a.extent) for a in op.axes]
        self._extent = {a.name: a.extent for a in op.axes}
        self._padded = dict(self._extent)
        self.predicated: set[str] = set()  # axes left unpadded (`predicate`)
        self._role = {a.name: a.role for a in op.axes}
        self._counter: dict[str, int] = {}
        self._nest: tuple = ()  # the loop nest the footprints in _elements were taken on
        self._elements: dict[tuple, int] = {}
        self.primitive = self._choose_primitive()

    # -- queries ----------------------------------------------------------------------------
    @property
    def capabilities(self) -> Capabilities:
        """What the machine's back end does with its movers (rows at a pitch, copies kept)."""
        return capabilities_of(self.machine.backend)

    def axes(self, role: str) -> list[Loop]:
        """Current loops whose axis has `role` ("b", "m", "n", "k"), in nest order."""
        return [lp for lp in self.loops if any(self._role[a] == role for a in lp.axes)]

    def loop(self, name: str) -> Loop:
        for lp in self.loops:
            if lp.name == name:
                return lp
        raise ScheduleError(f"loop({name!r}): no such loop; loops are "
                            f"{[lp.name for lp in self.loops]}")

    def level(self, role: str, operand: str) -> MemoryLevel | None:
        """The innermost memory level of `role` that may hold `operand`, or None."""
        lv = self.machine.levels(role, operand)
        return lv[-1] if lv else None

    def padded_extents(self) -> dict[str, int]:
        """Each axis's extent after padding to its outer tile and the primitive's shape."""
        return dict(self._padded)

    def tiled_extents(self) -> dict[str, int]:
        """Each axis's extent as its loops cover it: `padded_extents`, but a predicated axis
        (`predicate`) at its tiles' span too, the iterations its last tile runs under the
        predicate included."""
        out = dict(self._padded)
        parts = [p for lp in self.loops for p in (lp.parts or (lp,))]
        for axis in self.predicated:
            outer = next(p for p in parts if p.axes[0] == axis)
            out[axis] = outer.span
        return out

    def role_of(self, axis: str) -> str:
        if axis not in self._role:
            raise ScheduleError(f"role_of({axis!r}): no such axis; axes are {list(self._role)}")
        return self._role[axis]

    def __str__(self) -> str:
        head = f"schedule of {self.op} on {self.machine.name}"
        return "\n".join([head] + [f"  {s}" for s in self.steps])

    # -- writing out and replaying ---------------------------------------------------------
    def to_json(self) -> str:
        """The recorded steps as JSON, each loop by its name (names are deterministic, see
        `_fresh`), with the knob values (the lowering reads some) and what it was recorded
        for: `Schedule.replay` rebuilds the same schedule from it."""
        return json.dumps({"op": str(self.op), "machine": self.machine.name,
                           "knobs": self.knob_values,
                           "steps": [{"primitive": st.primitive, "args": _named(st.args)}
                                     for st in self.steps]})

    @classmethod
    def replay(cls, text: str, op: Operator, machine: Machine) -> "Schedule":
        """The schedule `to_json` wrote, recorded again on `op` and `machine` by calling its
        primitives with the loops they name (so every check runs again), then validated."""
        data = json.loads(text)
        if data["op"] != str(op) or data["machine"] != machine.name:
            raise ScheduleError(f"replay: the schedule was recorded for {data['op']} on "
                                f"{data['machine']}, not {op} on {machine.name}; record it "
                                f"again with tsl.schedule")
        s = cls(op, machine)
        s.knob_values = dict(data["knobs"])
        for st in data["steps"]:
            getattr(s, st["primitive"])(*[s._resolve(a) for a in st["args"]])
        s._check_capacity("replay")
        return s

    def _resolve(self, arg):
        if isinstance(arg, dict):
            return self.loop(arg["loop"])
        if isinstance(arg, list):
            return [self._resolve(a) for a in arg]
        return arg

    # -- knobs ------------------------------------------------------------------------------
    def knob(self, name: str, choices, default=None, refines: bool = False):
        """A tunable value. Returns the value fixed for `name` in the schedule's knobs, else
        `default` (else the first choice). `tsl.tune` searches over `choices`.

        `refines`: the knob changes a setting of the others rather than making one of its own
        (a split of the reduction refines a tiling); the model's search settles the other
        knobs with it at its first choice, then lets it move (`tsl.model.search`)."""
        choices = tuple(choices)
        if not choices:
            raise ScheduleError(f"knob({name!r}): needs at least one choice")
        self.space[name] = choices
        if refines:
            self.refining.add(name)
        value = self.knob_values.get(name, choices[0] if default is None else default)
        if value not in choices:
            raise ScheduleError(f"knob({name!r}): value {value!r} is not one of its choices "
                                f"{list(choices)}")
        self.knob_values[name] = value
        return value

    # -- loop structure ---------------------------------------------------------------------
    def tile(self, loop: Loop, *sizes: int) -> list[Loop]:
        """Split `loop` into len(sizes)+1 loops whose inner ones cover `sizes` elements.

        Before ``tile(i, 64, 16)``::

            for i in range(M): ...

        After (M padded up to a multiple of 64 when `i` is an outermost loop)::

            for i.0 in range(ceil(M/64)):
              for i.1 in range(4):
                for i.2 in range(16): ...

        Each size must divide the one before it, and an inner loop's span exactly.
        """
        self._check_loop("tile", loop)
        if len(loop.axes) != 1:
            raise ScheduleError(f"tile({loop.name}, ...): a fused loop cannot be tiled; tile "
                                f"before fuse")
        if not sizes:
            raise ScheduleError(f"tile({loop.name}): give at least one inner size")
        for s in sizes:
            if not isinstance(s, int) or isinstance(s, bool) or s <= 0:
                raise ScheduleError(f"tile({loop.name}, {sizes}): sizes must be positive ints")
        for outer, inner in zip(sizes, sizes[1:]):
            if outer % inner:
                raise ScheduleError(f"tile({loop.name}, {sizes}): {inner} does not divide "
                                    f"{outer}; each size must divide the one before it")
        axis = loop.axes[0]
        if sizes[-1] % loop.step:
            raise ScheduleError(f"tile({loop.name}, {list(sizes)}): sizes must be multiples "
                                f"of the loop's step {loop.step}")
        if self.axes_outermost(axis) is loop:
            # The outermost loop of an axis may grow: the axis is padded to its outer tile.
            span = -(-self._padded[axis] // sizes[0]) * sizes[0]
            if axis not in self.predicated:
                self._padded[axis] = span
        else:
            span = loop.span
            if span % sizes[0]:
                raise ScheduleError(f"tile({loop.name}, {list(sizes)}): {sizes[0]} does not "
                                    f"divide the loop's span {span}; pick a divisor of {span}")
        bounds = (span,) + tuple(sizes)
        new = []
        for outer, inner in zip(bounds, bounds[1:] + (loop.step,)):
            new.append(Loop(self._fresh(axis), (axis,), outer // inner, inner))
        pos = self.loops.index(loop)
        self.loops[pos:pos + 1] = new
        self.steps.append(Step("tile", (loop,) + tuple(sizes), tuple(new)))
        return new

    def predicate(self, loop: Loop) -> None:
        """Leave the axis of `loop` (not yet tiled) unpadded: the operator keeps its extent
        and the tiles that cross its end are predicated, for an operand read where it lies
        (an activation that a padded copy per call would cost more than the kernel saves).
        The back end masks the last tiles or splits them off the whole ones.

        Before ``predicate(j); tile(j, 16)`` on N = 196: ``for j.0 in range(13): for j.1 in
        range(16)`` over a B padded to 208 columns; after: the same loops over B's 196 columns,
        ``if j.0 * 16 + j.1 < 196`` around the body."""
        self._check_loop("predicate", loop)
        axis = loop.axes[0] if len(loop.axes) == 1 else None
        if (axis is None or loop is not self.axes_outermost(axis)
                or loop.extent != self._extent[axis]):
            raise ScheduleError(f"predicate({loop.name}): needs an axis's only loop, before it "
                                f"is tiled or fused")
        self.predicated.add(axis)
        self.steps.append(Step("predicate", (loop,)))

    def axes_outermost(self, axis: str) -> Loop:
        return next(lp for lp in self.loops if axis in lp.axes)

    split = tile

    def reorder(self, *loops: Loop) -> None:
        """Put `loops` in the given order, in the positions they occupy now.

        Before ``reorder(j, i)``: ``for i: for j: body``; after: ``for j: for i: body``.
        """
        for lp in loops:
            self._check_loop("reorder", lp)
        if len(set(map(id, loops))) != len(loops):
            raise ScheduleError(f"reorder({', '.join(l.name for l in loops)}): a loop is "
                                f"named twice")
        slots = sorted(self.loops.index(lp) for lp in loops)
        for pos, lp in zip(slots, loops):
            self.loops[pos] = lp
        self._check_axis_order("reorder")
        self.steps.append(Step("reorder", tuple(loops)))

    def fuse(self, *loops: Loop) -> Loop:
        """Fuse adjacent loops into one.

        Before ``fuse(i.0, j.0)``: ``for i.0 in range(4): for j.0 in range(8)``;
        after: ``for i.0*j.0 in range(32)``.
        """
        for lp in loops:
            self._check_loop("fuse", lp)
        pos = [self.loops.index(lp) for lp in loops]
        if len(loops) < 2 or pos != list(range(pos[0], pos[0] + len(loops))):
            raise ScheduleError(f"fuse({', '.join(l.name for l in loops)}): needs two or more "
                                f"loops that are adjacent, outer to inner; reorder first")
        f = Loop("*".join(lp.name for lp in loops), sum((lp.axes for lp in loops), ()),
                 math.prod(lp.extent for lp in loops),
                 parts=sum((lp.parts or (lp,) for lp in loops), ()))
        self.loops[pos[0]:pos[-1] + 1] = [f]
        self.steps.append(Step("fuse", tuple(loops), (f,)))
        return f

    # -- mapping onto the machine -----------------------------------------------------------
    def parallel(self, loops, level: str = "core") -> Loop | None:
        """Run `loops` (fused if several) in parallel across a compute level (a role such as
        "core"/"subcore" or a level name). A machine without that level runs them serially,
        which is recorded, so one schedule serves machines with and without it.

        Before ``parallel([i.0, j.0], "core")``: ``for i.0: for j.0: ...``;
        after: ``for i.0*j.0 in parallel(core): ...``.
        """
        loops = [loops] if isinstance(loops, Loop) else list(loops)
        for lp in loops:
            self._check_loop("parallel", lp)
            if any(self._role[a] == "k" for a in lp.axes) and not lp.split:
                raise ScheduleError(f"parallel({lp.name}, {level!r}): {lp.name} is a reduction "
                                    f"loop; only spatial loops (and a reduction loop made "
                                    f"split_reduction) can run in parallel")
        cl = self.machine.compute_level(level)
        if cl is None:
            self.steps.append(Step("parallel", (loops, level), ("serial: machine has no "
                                                                f"{level} level",)))
            return None
        if any(lp.parallel for lp in self.loops):
            outer = [lp for lp in self.loops if lp.parallel]
            if self.loops.index(outer[-1]) > self.loops.index(loops[0]):
                raise ScheduleError(f"parallel({loops[0].name}, {level!r}): must be inside the "
                                    f"loops already parallel ({outer[-1].name})")
        lp = self.fuse(*loops) if len(loops) > 1 else loops[0]
        if self.steps and self.steps[-1].primitive == "fuse" and len(loops) > 1:
            self.steps.pop()
        lp.parallel = cl.name
        self.steps.append(Step("parallel", (loops, level), (lp,)))
        return lp

    def split_reduction(self, loop: Loop) -> None:
        """Let the iterations of `loop`, the outermost loop of a reduction axis, accumulate
        separate partial sums, so that it may run in parallel (split-K): each iteration
        writes its partial result to the outermost memory level, and a second pass sums the
        partials in order, then applies the epilogue, once.

        Before ``split_reduction(k.0)``::

            for i: for j: for k.0 in range(S): for k.1: C[i, j] += A[i, k] * B[k, j]
            out[i, j] = epilogue(C[i, j])

        After::

            for i: for j: for k.0 in range(S): for k.1: P[k.0, i, j] += A[i, k] * B[k, j]
            for i: for j: out[i, j] = epilogue(P[0, i, j] + P[1, i, j] + ... P[S-1, i, j])
        """
        self._check_loop("split_reduction", loop)
        if len(loop.axes) != 1 or self._role[loop.axes[0]] != "k":
            raise ScheduleError(f"split_reduction({loop.name}): not a reduction loop; split "
                                f"the reduction axis with tile() and pass its outer loop")
        if self.axes_outermost(loop.axes[0]) is not loop:
            raise ScheduleError(f"split_reduction({loop.name}): only the outermost loop of "
                                f"axis {loop.axes[0]} can be split; it is "
                                f"{self.axes_outermost(loop.axes[0]).name}")
        if any(lp.split for lp in self.loops):
            raise ScheduleError(f"split_reduction({loop.name}): one reduction loop at most is "
                                f"split")
        loop.split = True
        self.steps.append(Step("split_reduction", (loop,)))

    @property
    def split_parts(self) -> int:
        """Partial sums per output element (the split reduction loop's extent; 1 if none)."""
        return next((p.extent for lp in self.loops for p in lp.parts or (lp,) if p.split), 1)

    def reduces(self, loop: Loop) -> bool:
        """Whether `loop` (or a loop fused into it) is a reduction loop not split."""
        return any(self._role[p.axes[0]] == "k" and not p.split for p in loop.parts or (loop,))

    def cache(self, operand: str, role: str, at: Loop) -> Stage | None:
        """Stage the tile of `operand` ("A", "B" or "C") used under loop `at` in the memory
        level of `role` that may hold it. For "C" the tile is accumulated there and written
        back after the reduction. Returns None when the machine has no such level.

        Before ``cache("A", "scratchpad", at=k.0)``::

            for k.0: for i.1: for k.1: C[..] += A[i, k] * B[k, j]

        After::

            for k.0:
              A_s[0:mi, 0:kt] = A[i.., k0*kt:]      # in the scratchpad level
              for i.1: for k.1: C[..] += A_s[..] * B[k, j]

        The tile's bytes (times the pipeline depth of `at`) must fit the level: otherwise a
        ScheduleError names the tile, the level and the bytes over.
        """
        if operand not in OPERAND_ROLES:
            raise ScheduleError(f"cache({operand!r}, ...): operand must be 'A', 'B' or 'C'")
        self._check_loop("cache", at)
        lv = self.level(role, operand)
        if lv is None:
            self.steps.append(Step("cache", (operand, role, at), ("skipped: no level",)))
            return None
        if operand == "C" and any(self.reduces(lp) for lp in self._outer(at)):
            raise ScheduleError(f"cache('C', {role!r}, at={at.name}): the accumulator must be "
                                f"staged outside every reduction loop; {at.name} is inside "
                                f"one. Stage it at a spatial loop outside k")
        dtype = self._operand_dtype(operand)
        st = Stage(operand, lv, at, self._tile_elements(operand, at, lv), dtype)
        self.stages.append(st)
        self._check_capacity(f"cache({operand!r}, {role!r}, at={at.name})")
        self.steps.append(Step("cache", (operand, role, at), (lv.name,)))
        return st

    def pipeline(self, loop: Loop, stages: int = 2) -> None:
        """Overlap the data movement of iteration t+1 of `loop` with the compute of iteration t
        (double buffering at stages=2): every tile staged at `loop` takes `stages` copies.

        Before ``pipeline(k.0, 2)``: ``for k.0: load(t); compute(t)``;
        after: ``load(0); for k.0: load(t+1) || compute(t)`` with two buffers per tile.
        """
        self._check_loop("pipeline", loop)
        if not isinstance(stages, int) or stages < 1:
            raise ScheduleError(f"pipeline({loop.name}, {stages!r}): stages must be an int >= 1")
        loop.stages = stages
        self._check_capacity(f"pipeline({loop.name}, {stages})")
        self.steps.append(Step("pipeline", (loop, stages)))

    def tensorize(self, loop: Loop, primitive: str | None = None) -> TensorPrimitive:
        """Map the loop nest from `loop` inwards onto a tensor primitive of the machine (the one
        for the operator's dtypes when not named). The nest must be exactly one m-, one n- and
        one k-loop of the primitive's extents (batch loops of extent 1 allowed).

        Before ``tensorize(i.3)`` on a 1x16x4 primitive::

            for i.3 in range(1): for j.3 in range(16): for k.2 in range(4): C += A * B

        After: ``prim_1x16x4(C[i, j:j+16], A[i, k:k+4], B[k:k+4, j:j+16])``.
        """
        self._check_loop("tensorize", loop)
        prim = self._primitive_named(primitive) if primitive else self.primitive
        if prim is None:
            raise ScheduleError(f"tensorize({loop.name}): machine {self.machine.name} has no "
                                f"tensor primitive for {self.op.dtype}")
        inner = self.loops[self.loops.index(loop):]
        want = {"m": prim.m, "n": prim.n, "k": prim.k}
        got: dict[str, int] = {}
        for lp in inner:
            if len(lp.axes) != 1:
                raise ScheduleError(f"tensorize({loop.name}): fused loop {lp.name} inside")
            r = self._role[lp.axes[0]]
            if lp.extent == 1 and r in ("b", "m", "k") and r in got:
                continue
            if r == "b" and lp.extent == 1:
                continue
            if r in got:
                raise ScheduleError(f"tensorize({loop.name}): two {r}-loops inside ({lp.name}); "
                                    f"reorder so that one m-, one n- and one k-loop remain")
            got[r] = lp.extent
        for r in "mnk":
            got.setdefault(r, 1)
        if got != want:
            raise ScheduleError(
                f"tensorize({loop.name}, {prim.name}): the loops inside have (m, n, k) = "
                f"({got['m']}, {got['n']}, {got['k']}) but the primitive is {prim.m}x{prim.n}x"
                f"{prim.k}; tile the m, n and k loops so the innermost ones match it")
        loop.tensorized = prim
        self.steps.append(Step("tensorize", (loop, prim.name)))
        return prim

    def pack(self, operand: str, layout: str = "primitive") -> None:
        """Store `operand` in the layout its primitive reads (B blocked or transposed, data in
        channel blocks). The artifact packs ordinary NumPy arrays before the kernel runs.

        Before: ``B[k, n]``; after ``pack("B")`` with a 16-wide primitive: ``B[n/16, k, 16]``.
        """
        if operand not in ("A", "B"):
            raise ScheduleError(f"pack({operand!r}): only inputs 'A' and 'B' can be packed")
        if layout != "primitive":
            raise ScheduleError(f"pack({operand!r}, {layout!r}): the only layout is "
                                "'primitive' (the one the tensor primitive reads)")
        self.packed[operand] = layout
        self.steps.append(Step("pack", (operand, layout)))

    def fuse_epilogue(self, at: Loop | None = None) -> None:
        """Apply the operator's epilogue (bias, relu, shift, clip) to the accumulator tile at
        `at` (default: where C is staged) before it is written out.

        Before: ``for ..: C[..] = acc`` then ``for ..: out[..] = relu(C[..] + bias)``;
        after: ``for ..: out[..] = relu(acc + bias)`` in the same nest.
        """
        if at is not None:
            self._check_loop("fuse_epilogue", at)
        self.epilogue_at = at or next((s.at for s in self.stages if s.operand == "C"), None)
        self.steps.append(Step("fuse_epilogue", (self.epilogue_at,)))

    # -- helpers ----------------------------------------------------------------------------
    def _primitive_named(self, name: str) -> TensorPrimitive:
        names = [p.name for p in self.machine.primitives]
        if name not in names:
            raise ScheduleError(f"tensorize(..., {name!r}): machine {self.machine.name} has no "
                                f"tensor primitive of that name; it has {names}")
        return self.machine.primitives[names.index(name)]

    def _choose_primitive(self) -> TensorPrimitive | None:
        op = self.op
        prim = self.machine.primitive(op.dtype)
        if prim is None and op.dtype == "int8":
            prim = self.machine.primitive("uint8", "int8")
        return prim

    def _operand_dtype(self, operand: str) -> str:
        if operand == "C":
            return self.op.acc_dtype
        return self.op.input(operand).dtype

    def op_footprint(self, operand: str, at: Loop, level: MemoryLevel | None = None) -> int:
        """Elements of `operand` touched by one iteration of `at` (its inner loops). A level
        shared by the instances of a finer compute level (shared memory of a block's warps)
        holds the tiles of all of them: loops outside `at` run in parallel on such a finer
        level count as well. A level filled by a mover of a back end whose copies take rows at a
        pitch (`capabilities.row_pitch`) holds only the rows of a strided window that the
        kernel reads (`Operator.tile_shape(rows_used=True)`)."""
        names = [c.name for c in self.machine.compute]
        shared_below = names.index(level.per) if level is not None and level.per in names else None
        inner = self.loops[self.loops.index(at) + 1:]
        if shared_below is not None:
            inner += [lp for lp in self.loops[:self.loops.index(at) + 1]
                      if lp.parallel and names.index(lp.parallel) > shared_below]
        ext = {a: 1 for a in self._extent}
        for lp in inner:
            for part in lp.parts or (lp,):
                ext[part.axes[0]] *= part.extent
        rows_used = (level is not None and self.capabilities.row_pitch
                     and any(mv.dst == level.name for mv in self.machine.movers))
        return self.op.footprint(operand, ext, rows_used)

    def validate(self) -> None:
        """Check every staged tile against its level again, on the final loop nest, and that
        every knob value given was for a knob the schedule function declared (a misspelt name
        would otherwise silently build with the default)."""
        unknown = [k for k in self._given if k not in self.space]
        if unknown:
            raise ScheduleError(f"knobs {unknown} are not knobs of this schedule of {self.op}; "
                                f"its knobs are {sorted(self.space)}")
        self._check_capacity("validate")

    def _outer(self, at: Loop) -> list[Loop]:
        return self.loops[:self.loops.index(at) + 1]

    def _tile_elements(self, operand: str, at: Loop, level: MemoryLevel) -> int:
        """`op_footprint`, kept while the loop nest stays as it is: every step re-checks
        every staged tile, and a search records thousands of schedules."""
        nest = tuple((lp.name, lp.extent, lp.parallel) for lp in self.loops)
        if nest != self._nest:
            self._nest, self._elements = nest, {}
        key = (operand, at.name, level.name)
        if key not in self._elements:
            self._elements[key] = self.op_footprint(operand, at, level)
        return self._elements[key]

    def _check_capacity(self, where: str) -> None:
        stages = []
        for st in self.stages:
            e = self._tile_elements(st.operand, st.at, st.level)
            stages.append(st if st.elements == e else replace(st, elements=e))
        self.stages = stages
        use: dict[str, int] = {}
        for st in self.stages:
            use[st.level.name] = use.get(st.level.name, 0) + st.bytes * st.at.stages
        p = self.primitive
        scratch = p.scratch if p is not None and p.c_level in use else 0
        if scratch:
            use[p.c_level] += scratch
        for name, used in use.items():
            lv = self.machine.memory_level(name)
            if used > lv.capacity:
                tiles = ", ".join(f"{s.operand} at {s.at.name}: {s.bytes} B x{s.at.stages}"
                                  for s in self.stages if s.level.name == name)
                if scratch and name == p.c_level:
                    tiles += f", {p.name}'s scratch: {scratch} B"
                raise ScheduleError(f"{where}: tiles in {lv.role} level {name!r} need {used} "
                                    f"bytes ({tiles}) but it holds {lv.capacity}: "
                                    f"{used - lv.capacity} bytes over; use smaller tiles or "
                                    f"fewer pipeline stages")

    def _check_loop(self, prim: str, loop) -> None:
        if not isinstance(loop, Loop) or loop not in self.loops:
            raise ScheduleError(f"{prim}({getattr(loop, 'name', loop)!r}): not a current loop "
                                f"of this schedule; loops are {[l.name for l in self.loops]}")

    def _check_axis_order(self, prim: str) -> None:
        seen: dict[str, int] = {}
        for lp in self.loops:
            if len(lp.axes) != 1:
                continue
            a = lp.axes[0]
            if seen.get(a, 1 << 62) < lp.step:
                raise ScheduleError(f"{prim}: loop {lp.name} would be inside a finer loop of "
                                    f"the same axis {a}; keep each axis' loops outer to inner")
            seen[a] = lp.step

    def _fresh(self, axis: str) -> str:
        n = self._counter.get(axis, 0)
        self._counter[axis] = n + 1
        return f"{axis}.{n}"
