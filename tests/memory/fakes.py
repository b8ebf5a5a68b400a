"""A fake CUDA runtime for the registration logic (engram.memory.registration) and what builds on it: it
records every call, and fails, lies or lacks read-only registration where a test asks it to."""

from __future__ import annotations

from engram.memory.registration import ATTRIBUTE_READ_ONLY_REGISTER, ERROR_NOT_SUPPORTED, HOST_REGISTER_READ_ONLY


class FakeRuntime:
    def __init__(
        self,
        fail_register_at: int | None = None,
        fail_pointer: bool = False,
        device_base: int | None = None,
        gap: int = 0,
        lie: bool = False,
        read_only: int = 1,
    ) -> None:
        self.calls: list[tuple] = []  # type: ignore[type-arg]
        self.registered: dict[int, int] = {}
        self.sticky = 0
        self.fail_register_at = fail_register_at
        self.fail_pointer = fail_pointer
        self.device_base = device_base
        self.gap = gap
        self.lie = lie  # registration "succeeds" but the driver does not know the memory
        self.read_only = read_only  # device attribute 113: read-only registration supported

    def host_register(self, addr: int, size: int, flags: int) -> int:
        self.calls.append(("register", addr, size, flags))
        if flags & HOST_REGISTER_READ_ONLY and not self.read_only:
            self.sticky = ERROR_NOT_SUPPORTED
            return ERROR_NOT_SUPPORTED
        if self.fail_register_at is not None and len(self.registered) == self.fail_register_at:
            self.sticky = 2
            return 2  # cudaErrorMemoryAllocation
        self.registered[addr] = size
        return 0

    def host_unregister(self, addr: int) -> int:
        self.calls.append(("unregister", addr))
        return 0 if self.registered.pop(addr, None) is not None else 1

    def host_get_device_pointer(self, addr: int) -> tuple[int, int]:
        if self.fail_pointer:
            self.sticky = 1
            return 1, 0
        first = min(self.registered)
        base = addr if self.device_base is None else self.device_base + (addr - first)
        return 0, base + (self.gap if addr != first else 0)

    def pointer_memory_type(self, addr: int) -> tuple[int, int]:
        inside = any(start <= addr < start + size for start, size in self.registered.items())
        return 0, 1 if inside and not self.lie else 0

    def device_attribute(self, attribute: int) -> tuple[int, int]:
        return 0, self.read_only if attribute == ATTRIBUTE_READ_ONLY_REGISTER else 0

    def get_last_error(self) -> int:
        code, self.sticky = self.sticky, 0
        self.calls.append(("get_last_error", code))
        return code

    def error_string(self, code: int) -> str:
        return {1: "invalid argument", 2: "out of memory", 801: "operation not supported"}.get(code, "unknown")


class FakeHostNumaRuntime(FakeRuntime):
    """FakeRuntime with the host-NUMA cuMem calls: a map is a fresh anonymous mapping rounded to 2 MiB at
    NUMA node `node` (-1: none), or fails at `fail_step` with `fail_code`; every unmap is recorded."""

    GRANULE = 2 << 20

    def __init__(self, node: int = 0, fail_step: int | None = None, fail_code: int = 2) -> None:
        super().__init__()
        self.node, self.fail_step, self.fail_code = node, fail_step, fail_code
        self.mapped: dict[int, int] = {}
        self.unmapped: list[tuple[int, int]] = []

    def device_attribute(self, attribute: int) -> tuple[int, int]:
        return (0, self.node) if attribute == 134 else super().device_attribute(attribute)

    def host_numa_map(self, size: int, chunk: int, node: int) -> tuple[int, int, int, int, int]:
        import mmap

        from engram.memory.mapping import _mmap

        self.calls.append(("host_numa_map", size, chunk, node))
        if self.fail_step is not None:
            self.sticky = self.fail_code
            return self.fail_code, 0, 0, 0, self.fail_step
        padded = -(-size // self.GRANULE) * self.GRANULE
        addr = _mmap(padded, mmap.PROT_READ | mmap.PROT_WRITE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self.mapped[addr] = padded
        return 0, addr, padded, self.GRANULE, 0

    def host_numa_unmap(self, addr: int, length: int, chunk: int) -> int:
        from engram.memory.mapping import _munmap

        self.unmapped.append((addr, length))
        assert self.mapped.pop(addr) == length
        _munmap(addr, length)
        return 0
