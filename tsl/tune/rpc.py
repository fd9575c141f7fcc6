"""Measurement on devices registered with a TVM RPC tracker (the tuning farm TVM users run):

    python -m tvm.exec.rpc_tracker --host 0.0.0.0 --port 9190
    python -m tvm.exec.rpc_server --tracker HOST:9190 --key x86     # on each device
    python -m tsl.tune "matmul 512x512x512 float32" --target cpu --rpc HOST:9190 --key x86

Each configuration is built here (the machine file describes the device), exported as a shared
library, uploaded to a device, checked there against the NumPy reference and timed with TVM's
`time_evaluator` on the device. Every free device of the key gets a session and a thread; a
batch is shared among them. A device that fails mid-measurement (killed, unplugged) costs its
measurement in flight, returned as lost with the reason; the others finish the batch.
"""

from __future__ import annotations

import os
import queue
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

from ..backend import resolve_target
from ..errors import BackendUnavailable, InputError, TSLError
from .runner import Outcome, Runner, _first_line

def parse_address(addr: str) -> tuple[str, int]:
    host, _, port = addr.rpartition(":")
    if not host or not port.isdigit():
        raise InputError(f"RPC tracker address {addr!r}: write HOST:PORT, e.g. 127.0.0.1:9190")
    return host, int(port)

@dataclass
class _Device:
    name: str
    session: object  # tvm.rpc.RPCSession
    alive: bool = True

class RPCRunner(Runner):
    """Measures on the devices of `key` at `tracker` ("HOST:PORT"): `devices` sessions (default:
    every server of the key that is free now)."""

    def __init__(self, tracker: str, key: str, devices: int | None = None, check: bool = True,
                 seed: int = 0, number: int = 5, repeat: int = 3):
        from tvm import rpc

        host, port = parse_address(tracker)
        try:
            self.tracker = rpc.connect_tracker(host, port)
            free = self.tracker.summary()["queue_info"].get(key, {}).get("free", 0)
        except (OSError, RuntimeError) as e:
            raise BackendUnavailable(f"no RPC tracker at {tracker}: {e}; start one with "
                                     f"`python -m tvm.exec.rpc_tracker`") from e
        n = devices or free
        if n == 0 or n > free:
            raise BackendUnavailable(f"RPC tracker {tracker} has {free} free server(s) for key "
                                     f"{key!r}, {n or 'at least 1'} wanted; start one with "
                                     f"`python -m tvm.exec.rpc_server --tracker {tracker} "
                                     f"--key {key}`")
        self.key, self.check, self.seed = key, check, seed
        self.number, self.repeat = number, repeat
        self.devices = [_Device(f"{key}#{i}", self.tracker.request(key, max_retry=2))
                        for i in range(n)]
        self.parallelism = n
        self._tmp = tempfile.TemporaryDirectory(prefix="tsl-rpc-")
        self._build_lock = threading.Lock()  # TVM's compile caches are set up once, here
        self._count = 0

    def run(self, schedules, schedule_fn):
        live = [d for d in self.devices if d.alive]
        if not live:
            raise BackendUnavailable(f"every RPC device of key {self.key!r} was lost")
        if not schedules:
            return []
        op = schedules[0].op
        xs = op.random_inputs(self.seed)
        want = op.reference(*xs) if self.check else None
        jobs: queue.Queue = queue.Queue()
        for n, s in enumerate(schedules):
            jobs.put((n, s))
        out: list[Outcome | None] = [None] * len(schedules)

        def work(dev: _Device) -> None:
            while dev.alive:
                try:
                    n, s = jobs.get_nowait()
                except queue.Empty:
                    return
                out[n] = self._one(dev, s, xs, want)
                dev.alive = not out[n].lost

        threads = [threading.Thread(target=work, args=(d,), daemon=True) for d in live]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        return [o or Outcome(error=f"not measured: every RPC device of key {self.key!r} was "
                             f"lost", device="rpc", lost=True) for o in out]

    def _one(self, dev: _Device, s, xs, want) -> Outcome:
        backend, _ = resolve_target(s.machine)
        with self._build_lock:
            try:
                art = backend.build(s)
            except TSLError as e:
                return Outcome(error=f"{type(e).__name__}: {_first_line(e)}", device=dev.name)
            if not hasattr(art, "executable"):
                raise InputError(f"RPC measurement needs a back end that exports a module "
                                 f"(cpu); {s.machine.name} builds {type(art).__name__}: use "
                                 f"a process pool (--workers) instead")
            self._count += 1
            path = os.path.join(self._tmp.name, f"k{self._count}.so")
            art.executable.export_library(path)
            packed = art.prepare(xs)
        try:
            return self._remote(dev, art, path, packed, want)
        except Exception as e:  # noqa: BLE001 - the session's errors: socket, TVM, remote crash
            return Outcome(error=f"device {dev.name} lost while measuring: {_first_line(e)}",
                           device=dev.name, lost=True)

    def _remote(self, dev: _Device, art, path: str, packed, want) -> Outcome:
        import tvm

        sess = dev.session
        sess.upload(path)
        lib = sess.load_module(os.path.basename(path))
        rdev = sess.cpu(0)
        out = art.ctx.op.output
        args = [tvm.runtime.tensor(x, rdev) for x in packed]
        args.append(tvm.runtime.empty(out.shape, out.dtype, rdev))
        if want is not None:
            lib["main"](*args)
            ok, err = art.op.check(art.op.crop_output(args[-1].numpy()), want)
            if not ok:
                return Outcome(error=f"wrong result on {dev.name}: error {err:.3g} against the "
                                     f"NumPy reference", device=dev.name)
        timer = lib.time_evaluator("main", rdev, number=self.number, repeat=self.repeat)
        secs = float(timer(*args).median)
        return Outcome(secs, "seconds", secs, device=dev.name)

    def close(self):
        for d in self.devices:
            d.alive = False
        self.devices = []
        self._tmp.cleanup()

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]

@contextmanager
def local_cluster(servers: int = 2, key: str = "local", lifetime: float = 300.0):
    """A tracker and `servers` RPC servers on 127.0.0.1, each in its own process group and
    bounded by `lifetime` seconds (coreutils `timeout`), stopped on exit. Yields
    (tracker address, [server process, ...]); kill a server with `kill(proc)`."""
    port = free_port()
    addr = f"127.0.0.1:{port}"
    life = ["timeout", "-s", "KILL", str(int(lifetime))]
    py = [sys.executable, "-m"]
    procs = [subprocess.Popen(life + py + ["tvm.exec.rpc_tracker", "--host", "127.0.0.1",
                                           "--port", str(port), "--port-end", str(port + 1),
                                           "--silent"], start_new_session=True)]
    try:
        # Started together: each imports TVM for seconds; a server retries the tracker.
        for _ in range(servers):
            p = free_port()
            procs.append(subprocess.Popen(
                life + py + ["tvm.exec.rpc_server", "--tracker", addr, "--key", key,
                             "--host", "127.0.0.1", "--port", str(p), "--port-end",
                             str(p + 20), "--silent"], start_new_session=True))
        _wait(lambda: _connects(port) and _free(addr, key) >= servers, 90,
              "the RPC tracker and servers did not come up")
        yield addr, procs[1:]
    finally:
        for p in procs:
            kill(p)

def kill(proc: subprocess.Popen) -> None:
    """Kill a process started by `local_cluster` with everything it started (its group)."""
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()

def _connects(port: int) -> bool:
    try:
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
        return True
    except OSError:
        return False

def _free(addr: str, key: str) -> int:
    from tvm import rpc

    try:
        t = rpc.connect_tracker(*parse_address(addr))
        return t.summary()["queue_info"].get(key, {}).get("free", 0)
    except (OSError, RuntimeError):
        return 0

def _wait(cond, seconds: float, what: str) -> None:
    end = time.monotonic() + seconds
    while not cond():
        if time.monotonic() > end:
            raise BackendUnavailable(f"{what} within {seconds:.0f} s")
        time.sleep(0.2)
