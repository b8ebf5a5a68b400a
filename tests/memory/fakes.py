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
