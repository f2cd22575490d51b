"""numba's CUDA simulator made thread-safe and quicker, and checking kernels for what a GPU would run wrong.

Races on shared and global memory, reads of unwritten shared memory, divergent barriers, and a block counting itself
done before its writes are published.
"""

from __future__ import annotations

import importlib
import linecache
import operator
import pkgutil
import sys
import threading
import warnings
from types import FrameType

import numpy as np

from compcoll.kernels import cuda, scalar


class DataRace(RuntimeError):
    """Two threads of a block touched one element of shared or global memory between the same two barriers, or two
    blocks one of global memory with no last-block count ordering them; at least one of the two wrote it."""


class UninitializedShared(RuntimeError):
    """A thread read a shared element that no thread of its block has written."""


class DivergentBarrier(RuntimeError):
    """Threads of a block waited at different barriers, which a GPU does not pair up as the simulator does."""


class UnpublishedWrites(RuntimeError):
    """A block counted itself done (an atomic) before every thread's global writes were fenced and, by a barrier,
    ordered before the count: the grid's last block could read them stale."""


def install(check: bool = True) -> None:
    """Prepare numba's simulator for the kernel checks.

    1. Shared arrays are looked up under a lock (``lock_shared_arrays``); with ``check`` each is
       a ``_Traced`` view whose element accesses are checked (``_note``).
    2. Blocks run on kept threads meeting at a condition-variable barrier
       (``run_blocks_on_a_barrier``); with ``check`` it refuses a divergent barrier, and global
       memory's element accesses, fences and atomics are checked too (``check_global_memory``).
    3. A device function's call is a plain Python call (``call_device_functions_directly``), and an array's
       attribute is found without listing the array's (``find_array_attributes_by_set``).
    4. Warnings are made thread-safe (``quiet_warnings``).
    5. A thread keeps the GIL for up to ``SWITCH_INTERVAL`` seconds, not Python's 5 ms.
    """
    lock_shared_arrays(check)
    run_blocks_on_a_barrier(check)
    if check:
        check_global_memory()
    call_device_functions_directly()
    find_array_attributes_by_set()
    quiet_warnings()
    sys.setswitchinterval(SWITCH_INTERVAL)


SWITCH_INTERVAL = 0.1
"""Seconds a simulated thread keeps the GIL before Python makes it pass it on (``sys.setswitchinterval``).

The threads of a block pass it among themselves anyway, at every barrier, lock and condition they wait on. A switch
forced every 5 ms (Python's default) can land inside a short critical section, the race checks' lock (``_note``)
among them, and the threads that take the GIL next then only queue on that lock. What the checks find does not
depend on the order the threads run in: they keep every access between two barriers, and catch a racing pair in
either order. ``test_cuda``'s two processes side by side on a quiet 2-core VM: 94.4 and 91.3 s of wall time at
5 ms, 73.1 and 74.1 s at 0.1 s."""


def find_array_attributes_by_set() -> None:
    """Make a kernel's ``array.size`` (``.shape``, ``.view``, ...) look the name up in a set of numpy's array
    attributes, made once.

    numba's simulator answers an attribute of a kernel's array (``FakeWithinKernelCUDAArray.__getattr__``) by
    building ``dir()`` of the numpy array behind it, every time, and looking the name up in that list: a name of
    the array is the array's attribute, another a field of a record. A numpy array has no attributes of its own
    (no ``__dict__``), so ``dir(numpy.ndarray)`` holds the same names; a name outside it goes to numba's own lookup.
    """
    from numba.cuda.simulator.cudadrv.devicearray import FakeWithinKernelCUDAArray

    own = FakeWithinKernelCUDAArray.__getattr__
    names = frozenset(dir(np.ndarray))

    def attribute(self: FakeWithinKernelCUDAArray, name: str):
        return getattr(self._item._ary, name) if name in names else own(self, name)

    FakeWithinKernelCUDAArray.__getattr__ = attribute


def call_device_functions_directly() -> None:
    """Make the call of a device function a plain Python call, without numba's swap of ``cuda`` in its module.

    numba's simulator makes every device call under ``swapped_cuda_module``: a context manager that walks the
    function's module globals for the ``cuda`` module, puts the launch's stand-in there, and walks them again to put
    it back when the call returns. A launch has already swapped its kernel's module for its whole length, and a
    device function that reads ``cuda`` is called only by kernels of its own module (``kernels.cuda``'s rule,
    ``test_cuda``'s syntax check), so its calls need no swap of their own. One that broke the rule would meet numba's
    real module on every call here, and fail at once, where numba's swap makes it fail now and then.
    """
    from numba.cuda.simulator.kernel import FakeCUDAKernel

    own = FakeCUDAKernel.__call__

    def call(self: FakeCUDAKernel, *args):
        return self.fn(*args) if self._device else own(self, *args)

    FakeCUDAKernel.__call__ = call


def lock_shared_arrays(check: bool) -> None:
    """Make the simulator hand every thread of a block the same ``cuda.shared.array``.

    numba's simulator (``FakeCUDAShared.array``) looks a shared array up by the calling
    line and creates it on a miss, without a lock. Two of a block's threads (Python
    threads) can both miss, and one then writes a private array that no other thread
    reads: wrong bits that a GPU never gives (CI saw it once in "encoded bits"). This
    replacement does the same lookup under a lock:
    1. Dynamic shared memory (shape 0) has no lookup: numba's own method serves it.
    2. Otherwise the key is the caller's file and line, as numba's.
    3. Under one lock, return the array stored for the key, or create and store it (with
       ``check``, a ``_Traced`` view named by the line's assignment).
    """
    from numba.core.types import Type
    from numba.cuda.simulator.kernelapi import FakeCUDAShared
    from numba.np.numpy_support import as_dtype

    own, lock = FakeCUDAShared.array, threading.Lock()

    def array(self, shape, dtype):
        if shape == 0:
            return own(self, shape, dtype)
        caller = sys._getframe(1)
        key = (caller.f_code.co_filename, caller.f_lineno)
        with lock:
            found = self._allocations.get(key)
            if found is None:
                found = np.empty(shape, as_dtype(dtype) if isinstance(dtype, Type) else dtype)
                if check:
                    found = _Traced.of(found, linecache.getline(*key).split("=")[0].strip() or f"{key}")
                self._allocations[key] = found
            return found

    FakeCUDAShared.array = array


_accesses = True
"""Whether ``install(check=True)`` checks element accesses now (``check_accesses``)."""


def check_accesses(on: bool) -> None:
    """Check element accesses (races, unwritten shared memory; the fences before a count) from now on, or not: a
    caller whose kernels' accesses another check already covers saves their cost (about half the simulator's time).
    Barriers are checked either way."""
    global _accesses
    _accesses = on


def _where(frame: FrameType) -> str:
    """The kernel's source position of a frame, as a message names it."""
    return _at((frame.f_code.co_name, frame.f_lineno))


def _element(shape: tuple, strides: tuple, key) -> int | None:
    """The byte offset of the one element ``key`` names (a negative index counting from the end, as numba's kernels
    count it); None where it names a view (a slice, or fewer indices than dimensions) or an element past either end
    (numpy then raises)."""
    index = key if key.__class__ is tuple else (key,)
    if len(index) != len(shape):
        return None
    offset = 0
    for i, n, stride in zip(index, shape, strides):
        if i.__class__ is not int:
            try:
                i = operator.index(i)
            except TypeError:
                return None
        if not -n <= i < n:
            return None
        offset += (i if i >= 0 else i + n) * stride
    return offset


def _note(place: tuple, name: str | tuple, key, write: bool, shared: bool) -> None:
    """Check one element access against its block's others since their last barrier (what ``compute-sanitizer``'s
    racecheck and initcheck do on a GPU).

    1. ``place`` names the element: (a shared array's element size, its address), or (None, its address).
    2. The block's run keeps, per element, the barrier generation of its last accesses, the
       thread that wrote it then and the threads that read it, and whether any thread of the
       block wrote it (atomics are left out: ``check_global_memory``).
    3. A read of an element another thread wrote in the same generation, or a write of one
       another thread wrote or read then, raises ``DataRace`` naming both threads and
       source lines; a read of a shared element no thread of the block wrote raises
       ``UninitializedShared``. The simulator then fails the launch.
    """
    lane = threading.current_thread()
    if lane.atomic:
        return
    manager = lane._manager
    generation, me, here = manager.generation, lane.thread_id, sys._getframe(2)
    here = (here.f_code.co_name, here.f_lineno)
    with manager.seen_lock:
        seen = manager.seen.get(place)
        if seen is None:
            seen = manager.seen[place] = [generation, None, {}, False]
        elif seen[0] != generation:
            seen[0], seen[1], seen[2] = generation, None, {}
        writer, readers = seen[1], seen[2]
        other = writer if writer is not None and writer[0] != me else None
        if other is None and write and readers:
            for t, at in readers.items():
                if t != me:
                    other = (t, at)
                    break
        if other is not None:
            raise DataRace(
                f"{_named(name, key, shared)}: thread {me} {'writes' if write else 'reads'} it at {_at(here)} after "
                f"thread {other[0]} {'wrote' if other is writer else 'read'} it at {_at(other[1])}, with no barrier "
                f"between, in block {list(lane.blockIdx)}")
        if not shared:
            other = _note_grid(manager, place, write, lane.block, here)
            if other is not None:
                raise DataRace(f"{_named(name, key, shared)}: thread {me} of block {list(lane.blockIdx)} "
                               f"{'writes' if write else 'reads'} it at {_at(here)}, block {list(other[0])} "
                               f"{'wrote' if other[3] else 'read'} it at {_at(other[2])}, and no count orders the "
                               f"two blocks")
        if write:
            seen[1], seen[3] = (me, here), True
        elif shared and not seen[3]:
            raise UninitializedShared(f"{_named(name, key, shared)}: thread {me} reads it at {_at(here)}, and no "
                                      f"thread of block {list(lane.blockIdx)} has written it")
        else:
            readers[me] = here


def _note_grid(manager, place: tuple, write: bool, block: tuple, here: tuple[str, int]) -> tuple | None:
    """Check a global element access against the other blocks' in the same launch (the simulator runs blocks in
    turn; a GPU runs them at once); return the other block's access it races with, else None.

    1. Per element the launch keeps its last write and each block's last read: the block, how
       many counts that block had made before it (``check_global_memory``), where.
    2. An access is ordered after another block's access if this block counted in some count
       (an atomic's element), with a barrier since, that the other block counted in after its
       access (the fence, barrier and count publish it; the simulator runs blocks in turn, so the
       other block's counts are all known): the last block of a grid, or of a group of blocks
       with a count of its own (``kernels.cuda.sums._finish_lanes``). Nothing else orders two blocks.
    3. A write unordered with another block's write or read, or a read unordered with another
       block's write, is a race (``_note`` raises ``DataRace``).
    """
    mine = {count for count, generation in manager.counts if generation < manager.generation}
    counts_of = manager.launch.counts_of
    entry = manager.launch.grid_seen.get(place)
    if entry is None:
        entry = manager.launch.grid_seen[place] = [None, None]
    earlier = [entry[0]] if entry[0] is not None else []
    if write and entry[1] is not None:
        earlier += entry[1].values()
    for other in earlier:
        if other[0] != block and mine.isdisjoint(counts_of.get(other[0], [])[other[1]:]):
            return other
    access = (block, len(manager.counts), here, write)
    if write:
        entry[0] = access
    else:
        if entry[1] is None:
            entry[1] = {}
        entry[1][block] = access
    return None


def _named(name: str | tuple, key, shared: bool) -> str:
    """An element as a message names it: the shared array's name, or the global array's shape, and the index."""
    return f"{'shared' if shared else 'global'} array {name}{list(key) if isinstance(key, tuple) else [key]}"


def _at(where: tuple[str, int]) -> str:
    """A (function, line) position as a message names it."""
    return f"{where[0]} line {where[1]}"


class _Traced(np.ndarray):
    """A shared array whose element reads and writes are checked (``_note``); a slice is a view, checked alike.

    An element is named by its address, so that a view of another dtype (``staged.view(np.float64)``) or a slice
    (``staged[first:]``), made anew by each thread that takes it, names the same elements for every thread; its
    elements are not matched with the other dtype's that overlap them (a kernel reuses a shared array as another
    dtype after a barrier). Taking a slice reads and writes nothing.
    """

    name: str
    address: int

    @classmethod
    def of(cls, array: np.ndarray, name: str) -> _Traced:
        traced = array.view(cls)
        traced.name = name
        return traced

    def __array_finalize__(self, base: np.ndarray | None) -> None:
        self.name = getattr(base, "name", "")
        self.address = self.__array_interface__["data"][0]

    def _place(self, key) -> tuple:
        offset = _element(self.shape, self.strides, key)
        if offset is None:
            raise IndexError(f"shared array {self.name}: index {key!r} is not one element of shape {self.shape}")
        return self.dtype.itemsize, self.address + offset

    def __getitem__(self, key):
        if key.__class__ is slice:
            return super().__getitem__(key)
        if _accesses:
            _note(self._place(key), self.name, key, False, True)
        return super().__getitem__(key)

    def __setitem__(self, key, value) -> None:
        if _accesses:
            _note(self._place(key), self.name, key, True, True)
        super().__setitem__(key, value)


def check_global_memory() -> None:
    """Check a kernel's global memory as ``_note`` checks shared memory, and the grid's last-block count.

    1. Reads and writes of one element of a kernel's array argument are checked by its address
       (views of one buffer alias) against the block's other threads, and against the other
       blocks of the launch (``_note_grid``).
    2. A thread's global write is pending until a fence publishes it: its own thread's
       ``cuda.threadfence``, or any thread's of its block after a barrier that followed the write
       (the barrier orders the write before that fence, which makes it visible with its own: the
       pattern of CUDA's cooperative-groups grid barrier, where one thread fences for the block).
    3. An atomic add is the count by which a block learns it is the last of the grid (or of its
       group) to finish: the block's counts, by the atomic's element, order its later accesses
       after the other blocks' (``_note_grid``). It raises ``UnpublishedWrites`` where a thread
       of the block has a pending write, or another thread fenced in the count's own barrier
       generation; so does another thread's write or fence after the count in that generation
       (whichever comes second in the simulator's order, the pair is caught).
    """
    from numba.cuda.simulator.cudadrv.devicearray import FakeWithinKernelCUDAArray
    from numba.cuda.simulator.kernelapi import FakeCUDAAtomic, FakeCUDAModule

    own_get, own_set, own_add = (FakeWithinKernelCUDAArray.__getitem__, FakeWithinKernelCUDAArray.__setitem__,
                                 FakeCUDAAtomic.add)

    def place(array: FakeWithinKernelCUDAArray, key) -> tuple | None:
        layout = array.__dict__.get("layout")
        if layout is None:
            ary = array._item._ary
            layout = array.__dict__["layout"] = (ary.__array_interface__["data"][0], ary.shape, ary.strides)
        offset = _element(layout[1], layout[2], key)
        return None if offset is None else (None, layout[0] + offset)

    def getitem(self, key):
        at = place(self, key) if _accesses else None
        if at is not None:
            _note(at, self._item._ary.shape, key, False, False)
        return own_get(self, key)

    def after_count(lane, does: str) -> None:
        counted = lane._manager.counted
        if counted is not None and counted[0] == lane._manager.generation and counted[1] != lane.thread_id:
            raise UnpublishedWrites(f"thread {lane.thread_id} {does} with no barrier after thread {counted[1]}'s "
                                    f"count at {counted[2]}")

    def setitem(self, key, value) -> None:
        at = place(self, key) if _accesses else None
        if at is not None:
            _note(at, self._item._ary.shape, key, True, False)
            lane = threading.current_thread()
            if not lane.atomic:
                frame = sys._getframe(1)
                lane.pending = (frame.f_code.co_name, frame.f_lineno, lane._manager.generation)
                if lane._manager.counted is not None:
                    after_count(lane, f"writes global memory at {_at(lane.pending)}")
        own_set(self, key, value)

    def threadfence(self) -> None:
        lane = threading.current_thread()
        here = _where(sys._getframe(1))
        after_count(lane, f"fences at {here}")
        generation = lane._manager.generation
        published = False
        for other in lane._manager.lanes:
            pending = other.pending  # read once: the other thread may write again meanwhile, in this generation
            if pending is not None and (other is lane or pending[2] < generation):
                published = True
                if other.pending is pending:
                    other.pending = None
        if published:
            lane.fenced = (generation, here)

    def add(self, array, index, value):
        lane = threading.current_thread()
        manager, here = lane._manager, _where(sys._getframe(1))
        manager.counted = (manager.generation, lane.thread_id, here)
        count = place(array, index)
        manager.counts.append((count, manager.generation))
        manager.launch.counts_of.setdefault(lane.block, []).append(count)
        for other in manager.lanes:
            if other.pending is not None:
                raise UnpublishedWrites(f"thread {lane.thread_id} counts at {here} while thread {other.thread_id}'s "
                                        f"global write at {_at(other.pending)} is not fenced")
            if other is not lane and other.fenced is not None and other.fenced[0] == manager.generation:
                raise UnpublishedWrites(f"thread {lane.thread_id} counts at {here} with no barrier after thread "
                                        f"{other.thread_id}'s fence at {other.fenced[1]}")
        lane.atomic = True
        try:
            return own_add(self, array, index, value)
        finally:
            lane.atomic = False

    FakeWithinKernelCUDAArray.__getitem__, FakeWithinKernelCUDAArray.__setitem__ = getitem, setitem
    FakeCUDAModule.threadfence, FakeCUDAAtomic.add = threadfence, add


def run_blocks_on_a_barrier(check: bool) -> None:
    """Run each simulated block on kept threads that meet at a condition-variable barrier, not on new threads
    and numba's polling loop.

    numba's simulator (``BlockManager.run``) starts a new Python thread for each CUDA thread of
    each block (65,000 in one of ``test_cuda``'s processes), then polls them all, without
    sleeping, until each one is blocked in ``syncthreads`` or has ended: the loop takes much of
    the CPU and keeps the GIL from the threads doing the work. Here (``test_cuda``'s two
    processes took 57 and 44 CPU-seconds with numba's runner, 42 and 36 with the barrier on new
    threads, 38 and 32 with kept ones) the meaning stays numba's: ``syncthreads`` returns once
    every thread of the block that has not ended has reached it; a thread that raises aborts the
    others, and the launch raises its error, named by thread and block as numba names it.
    1. The launching thread takes a kept thread (a lane) per CUDA thread of the block, making
       more where too few are idle, gives each its indices and the kernel's arguments, counts
       them all as live and none as blocked, and lets them go.
    2. ``syncthreads`` counts the thread as blocked; the last live thread to block opens the
       barrier (a new generation) for all, and the others sleep until it does. With ``check``,
       a thread reaching a barrier at another source line than the generation's first raises
       ``DivergentBarrier`` (``compute-sanitizer --tool synccheck``'s check).
    3. A lane whose kernel returns goes back to the idle lanes and is no longer live, opening the
       barrier if all that remain are blocked; the first error is kept, and every lane of the
       block is told to abort.
    4. The launching thread sleeps until no lane is live, and raises the first error.
    A launch in numba's debug mode raises on division by zero, as numba's runner makes it.
    """
    from numba.cuda.simulator import kernel as simulated
    from numba.cuda.simulator.kernel import BlockManager, BlockThread, Dim3

    idle, idle_lock = [], threading.Lock()

    def open_barrier(manager: BlockManager) -> None:
        manager.blocked, manager.generation = 0, manager.generation + 1
        manager.turn.notify_all()

    def syncthreads(self: BlockThread) -> None:
        manager = self._manager
        here = _where(sys._getframe(2)) if check else None
        with manager.turn:
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads call")
            if manager.blocked == 0:
                manager.barrier = (self.thread_id, here)
            elif here != manager.barrier[1]:
                raise DivergentBarrier(f"thread {self.thread_id} waits at the barrier at {here}, thread "
                                       f"{manager.barrier[0]} at {manager.barrier[1]}")
            generation, manager.blocked = manager.generation, manager.blocked + 1
            if manager.blocked == manager.live:
                open_barrier(manager)
            while manager.generation == generation and not self.abort:
                manager.turn.wait()
            if self.abort:
                raise RuntimeError("abort flag set on syncthreads clear")

    class Lane(BlockThread):
        """A simulated CUDA thread kept for block after block: ``run`` waits for ``go``, then runs the kernel with
        the indices and arguments the launching thread set."""

        def __init__(self) -> None:
            threading.Thread.__init__(self, daemon=True)
            self.go = threading.Semaphore(0)
            self.start()

        def run(self) -> None:
            while True:
                self.go.acquire()
                manager = self._manager
                try:
                    with np.errstate(divide="raise" if manager._debug else None):
                        manager._f(*self.job)
                except BaseException as exc:  # noqa: BLE001 - the launch raises it, as numba's runner does
                    where = f"tid={list(self.threadIdx)} ctaid={list(self.blockIdx)}"
                    with manager.turn:
                        if manager.failed is None:
                            manager.failed = (type(exc)(f"{where}: {exc}" if str(exc) else where), exc.__traceback__)
                            for lane in manager.lanes:
                                lane.abort = True
                with idle_lock:
                    idle.append(self)
                with manager.turn:
                    manager.live -= 1
                    if manager.live and manager.blocked == manager.live:
                        open_barrier(manager)
                    manager.turn.notify_all()

    def run(self: BlockManager, grid_point, *args) -> None:
        self.turn, self.blocked, self.generation, self.failed = threading.Condition(), 0, 0, None
        self.seen, self.seen_lock, self.counted, self.counts = {}, threading.Lock(), None, []
        self.launch = simulated._kernel_context  # the launch's FakeCUDAModule: one BlockManager a block
        if not hasattr(self.launch, "grid_seen"):
            self.launch.grid_seen, self.launch.counts_of = {}, {}
        points = list(np.ndindex(*self._block_dim))
        with idle_lock:
            self.lanes = [idle.pop() for _ in range(min(len(idle), len(points)))]
        self.lanes += [Lane() for _ in range(len(points) - len(self.lanes))]
        self.live = len(points)
        x, y, _ = self._block_dim
        for lane, point in zip(self.lanes, points):
            lane._manager, lane.job, lane.abort = self, args, False
            lane.atomic, lane.pending, lane.fenced = False, None, None
            lane.blockIdx, lane.threadIdx, lane.thread_id = Dim3(*grid_point), Dim3(*point), point[0] + x * (
                point[1] + y * point[2])
            lane.block = tuple(grid_point)
        for lane in self.lanes:
            lane.go.release()
        with self.turn:
            while self.live:
                self.turn.wait()
        if self.failed is not None:
            raise self.failed[0].with_traceback(self.failed[1])

    BlockThread.syncthreads, BlockManager.run = syncthreads, run


def quiet_warnings() -> None:
    """Give the modules whose code the simulator's threads run their warning registries before any thread warns.

    The simulator runs the 64-bit hash on numpy scalars, which warn when they wrap (as
    intended). Python's ``warnings.warn`` adds ``__warningregistry__`` to the warning
    frame's module globals on the first warning, whatever the filters, while another
    simulator thread may be iterating those globals (numba's ``swapped_cuda_module``
    does at every launch): "dictionary changed size during iteration" (CI saw it
    once). So:
    1. Every module with kernel or device-function code gets its registry now.
    2. The wrap-around warnings are ignored.
    """
    names = [f"{cuda.__name__}.{module.name}" for module in pkgutil.iter_modules(cuda.__path__)]
    for module in (scalar, *map(importlib.import_module, names)):
        module.__dict__.setdefault("__warningregistry__", {})
    warnings.filterwarnings("ignore", message="overflow encountered", category=RuntimeWarning)
