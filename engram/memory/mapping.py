"""Memory mappings that hold tables: anonymous (private), aligned anonymous (huge pages) and shared files.

The mapping is owned by a ctypes array over its bytes; tensors are views that keep that array alive, and
a finalizer unmaps (after running any release hooks, such as cudaHostUnregister) when the last view is
gone. So a table can never be read after its memory is unmapped, and `release()` frees it at once when
nothing else still holds a view."""

from __future__ import annotations

import ctypes
import ctypes.util
import mmap
import os
import weakref
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from engram.errors import EngramError

PAGE = mmap.PAGESIZE
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
_libc.fstatfs.argtypes = [ctypes.c_int, ctypes.c_void_p]
MAP_FAILED = ctypes.c_void_p(-1).value
MADV_DONTFORK = 10
MADV_DONTDUMP = 16
MADV_POPULATE_WRITE = 23


def round_up(n: int, to: int) -> int:
    return -(-n // to) * to


def _mmap(size: int, prot: int, flags: int, fd: int = -1) -> int:
    addr = _libc.mmap(None, size, prot, flags, fd, 0)
    if addr in (None, MAP_FAILED):
        err = ctypes.get_errno()
        raise EngramError(f"cannot map {size:,} bytes: {os.strerror(err)}")
    return int(addr)


def _munmap(addr: int, size: int) -> None:
    if size and _libc.munmap(addr, size) != 0:
        raise OSError(ctypes.get_errno(), f"munmap failed: {os.strerror(ctypes.get_errno())}")


HUGETLBFS_MAGIC = 0x958458F6


def file_system(fd: int) -> tuple[int, int]:
    """(f_type, f_bsize) of the file system holding open file `fd` (fstatfs), or (0, PAGE) if unknown."""
    buf = (ctypes.c_long * 32)()  # struct statfs: f_type, then f_bsize, on Linux
    if _libc.fstatfs(fd, buf) != 0:
        return 0, PAGE
    return buf[0] & 0xFFFFFFFF, int(buf[1])


def file_granule(fd: int) -> int:
    """The unit a mapping of `fd` is made and unmapped in: the huge page size on hugetlbfs (munmap of a
    length that is not a multiple of it fails, and the mapping would leak until exit), else the page."""
    kind, block = file_system(fd)
    return max(PAGE, block) if kind == HUGETLBFS_MAGIC else PAGE


def madvise(addr: int, size: int, advice: int) -> int:
    """0, or the errno of a failed madvise (callers decide whether that matters)."""
    return 0 if _libc.madvise(addr, size, advice) == 0 else ctypes.get_errno()


HUGE_PAGE = 2 << 20
MADV_HUGEPAGE = 14


@dataclass(eq=False)
class Mapping:
    """`size` bytes at `addr` (the mapped length is `length`, page rounded)."""

    addr: int
    size: int
    length: int
    kind: str
    path: str | None = None
    file_id: tuple[int, int] | None = None  # (device, inode) of the file mapped, to know it again by name
    fd: int | None = (
        None  # a mapped file's own descriptor, kept: what it says is the mapped inode's, whatever the name now holds
    )
    direct_fd: int | None = (
        None  # the descriptor for reads past the page cache (fd with O_DIRECT set), where the file system takes it
    )
    gpu_page: int | None = None  # the page size a GPU maps it with, where known (host-NUMA cuMem: 2 MiB)
    unmap: Callable[[int, int], None] | None = field(default=None, repr=False)  # not munmap: its allocator's
    _array: ctypes.Array[ctypes.c_uint8] | None = field(default=None, repr=False)
    _hooks: list[Callable[[], None]] = field(default_factory=list, repr=False)

    def __post_init__(self) -> None:
        self._array = (ctypes.c_uint8 * self.size).from_address(self.addr)
        # The finalizer holds only plain values, never the Mapping, so views alone decide its lifetime.
        self._finalizer = weakref.finalize(
            self._array, _unmap, self.addr, self.length, self._hooks, self.unmap or _munmap
        )

    def on_release(self, hook: Callable[[], None]) -> None:
        """Run `hook` just before the memory is unmapped (e.g. cudaHostUnregister)."""
        self._hooks.append(hook)

    def view(self, offset: int, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
        if self._array is None:
            raise EngramError(f"the {self.kind} mapping was released")
        count = 1
        for dim in shape:
            count *= dim
        nbytes = count * torch.empty((), dtype=dtype).element_size()
        if offset < 0 or offset + nbytes > self.size:
            raise EngramError(f"internal: view [{offset}, {offset + nbytes}) outside a {self.size}-byte mapping")
        flat = (
            torch.frombuffer(self._array, dtype=torch.uint8, count=nbytes, offset=offset)
            if nbytes
            else torch.empty(0, dtype=torch.uint8)
        )
        return flat.view(dtype).view(shape)

    @property
    def mapped(self) -> bool:
        """Whether the memory is still mapped (some view, or this handle, keeps it)."""
        return bool(self._finalizer.alive)

    def release(self) -> bool:
        """Drop this handle's reference. True when the memory was unmapped now; False when views held
        elsewhere keep it alive (it is unmapped when the last of them goes)."""
        self._array = None
        return not self._finalizer.alive


def _unmap(addr: int, length: int, hooks: list[Callable[[], None]], unmap: Callable[[int, int], None]) -> None:
    for hook in hooks:
        hook()
    unmap(addr, length)


PINNED_KINDS = ("pinned", "hugepages")  # private mappings a GPU may register


def map_anonymous(size: int, *, align: int = PAGE, kind: str = "host") -> Mapping:
    """A private anonymous mapping of `size` bytes, rounded up to `align`, starting `align`-aligned.
    Over-allocation for alignment is unmapped again, so exactly round_up(size, align) stays mapped."""
    length = round_up(max(size, 1), align)
    prot, flags = mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS
    if align <= PAGE:
        start = _mmap(length, prot, flags)
    else:
        base = _mmap(length + align, prot, flags)
        start = round_up(base, align)
        _munmap(base, start - base)
        _munmap(start + length, base + align - start)
    # Tables of hundreds of GB have no place in a core dump; the distinct flag also keeps the kernel from
    # merging the mapping with the heap next to it, so smaps shows it on its own.
    madvise(start, length, MADV_DONTDUMP)
    if kind in PINNED_KINDS:  # a fork would otherwise copy-on-write pages the GPU reads by address
        madvise(start, length, MADV_DONTFORK)
    return Mapping(start, size, length, kind)


def map_readonly_file(fd: int, size: int, path: str) -> Mapping:
    """The file read-only and shared: its pages are the page cache's, one copy for every process on the
    node that maps it. Reading past a shrunken end raises SIGBUS: read it only through guarded kernels."""
    length = round_up(max(size, 1), file_granule(fd))
    addr = _mmap(length, mmap.PROT_READ, mmap.MAP_SHARED, fd)
    madvise(addr, length, MADV_DONTDUMP)
    info = os.fstat(fd)
    return Mapping(addr, size, length, "file", path=path, file_id=(info.st_dev, info.st_ino))


def map_shared_file(fd: int, size: int, path: str) -> Mapping:
    length = round_up(max(size, 1), file_granule(fd))
    addr = _mmap(length, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_SHARED, fd)
    return Mapping(addr, size, length, "shm", path=path)


def map_sealed_file(fd: int, size: int, path: str) -> Mapping:
    """A sealed memfd (F_SEAL_WRITE) shared read-only: one copy of its pages for every process mapping it."""
    length = round_up(max(size, 1), PAGE)
    addr = _mmap(length, mmap.PROT_READ, mmap.MAP_SHARED, fd)
    madvise(addr, length, MADV_DONTDUMP)
    return Mapping(addr, size, length, "node", path=path)
