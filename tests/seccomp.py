"""A sandbox for tests, as a container runtime's seccomp profile makes one: after deny_netlink(), this
process and its children can open no netlink socket (socket(AF_NETLINK, ...) fails with EAFNOSUPPORT),
so the kernel's sock_diag cannot be asked who owns a socket. A classic BPF filter, installed with prctl;
x86_64 and aarch64."""

from __future__ import annotations

import ctypes
import errno
import platform
import socket
import struct

PR_SET_NO_NEW_PRIVS, PR_SET_SECCOMP, SECCOMP_MODE_FILTER = 38, 22, 2
SECCOMP_RET_ALLOW, SECCOMP_RET_ERRNO = 0x7FFF0000, 0x00050000
LOAD_WORD, JUMP_IF_EQUAL, RETURN = 0x20, 0x15, 0x06  # BPF_LD|BPF_W|BPF_ABS, BPF_JMP|BPF_JEQ|BPF_K, BPF_RET|BPF_K
ARCHES = {"x86_64": (0xC000003E, 41), "aarch64": (0xC00000B7, 198)}  # AUDIT_ARCH_*, __NR_socket
NR, ARCH, FIRST_ARGUMENT = 0, 4, 16  # offsets in struct seccomp_data (the argument's low word: little endian)


class _Program(ctypes.Structure):
    _fields_ = [("len", ctypes.c_ushort), ("filter", ctypes.c_void_p)]


def deny_netlink() -> None:
    """Install the filter (module docstring); raises OSError where the kernel refuses it."""
    arch, socket_nr = ARCHES[platform.machine()]
    code = [
        (LOAD_WORD, 0, 0, ARCH),
        (JUMP_IF_EQUAL, 0, 5, arch),  # another ABI: allowed (this process makes no such calls)
        (LOAD_WORD, 0, 0, NR),
        (JUMP_IF_EQUAL, 0, 3, socket_nr),
        (LOAD_WORD, 0, 0, FIRST_ARGUMENT),
        (JUMP_IF_EQUAL, 0, 1, socket.AF_NETLINK),
        (RETURN, 0, 0, SECCOMP_RET_ERRNO | errno.EAFNOSUPPORT),
        (RETURN, 0, 0, SECCOMP_RET_ALLOW),
    ]
    raw = ctypes.create_string_buffer(b"".join(struct.pack("=HBBI", *op) for op in code))
    program = _Program(len(code), ctypes.cast(raw, ctypes.c_void_p))
    libc = ctypes.CDLL(None, use_errno=True)
    if libc.prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 or (
        libc.prctl(PR_SET_SECCOMP, SECCOMP_MODE_FILTER, ctypes.byref(program), 0, 0) != 0
    ):
        raise OSError(ctypes.get_errno(), "cannot install a seccomp filter")
