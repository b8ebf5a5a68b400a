"""Primality and prime walks for bucket sizes (tens of millions: Miller-Rabin is exact and instant)."""

from __future__ import annotations

from collections.abc import Iterator

# With these bases Miller-Rabin is deterministic for every n < 3.3e24, far past any table size.
_BASES = (2, 3, 5, 7, 11, 13, 17, 19, 23, 29, 31, 37, 41)


def is_prime(n: int) -> bool:
    if n < 2:
        return False
    for p in _BASES:
        if n % p == 0:
            return n == p
    d, s = n - 1, 0
    while d % 2 == 0:
        d, s = d // 2, s + 1
    for a in _BASES:
        x = pow(a, d, n)
        if x in (1, n - 1):
            continue
        for _ in range(s - 1):
            x = x * x % n
            if x == n - 1:
                break
        else:
            return False
    return True


def primes_above(n: int) -> Iterator[int]:
    """Primes greater than n, in increasing order."""
    candidate = n + 1
    while True:
        if is_prime(candidate):
            yield candidate
        candidate += 1
