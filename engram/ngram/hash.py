"""N-gram row ids from compressed token ids, vectorised in torch with int64 arithmetic.

For position t and lookback k the hasher reads x[t-k], or the fill id (DeepSeek: the pad's compressed
id; Qwen: EOS) once the lookback is blocked. Blocking latches: a dead position blocks itself and every
position before it; a Qwen EOS blocks every position before it (the EOS itself is read, and it equals the
fill). Each position's earliest readable index is a running maximum of those barriers, so the whole
prompt is hashed with array operations and no per-token Python loop.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engram.errors import EngramError
from engram.memory.outputs import empty_cpu
from engram.ngram.layout import Layout
from engram.ops import check_token_ids, cpu, ngram_hash_reference
from engram.ops.devices import ensure_kernels


@dataclass(frozen=True)
class HashState:
    """What a request carries between steps: its last N-1 compressed ids and how many of them the next
    token may still read (0 for a fresh request: before the first token everything reads the fill). Both
    stay tensors on the ids' device, so a step on a GPU never waits for the host (no sync, capturable)."""

    history: torch.Tensor  # int64 [N-1], oldest first
    readable: torch.Tensor  # int64 [], in [0, N-1]


class NgramHasher:
    """hash(compressed_ids [T] int64, dead=None) -> int64 [T, layers, (N-1)*K] row ids, offsets included."""

    def __init__(self, layout: Layout, fill_id: int, eos_id: int | None = None, *, backend: str = "auto") -> None:
        if backend not in ("auto", "native", "torch"):
            raise EngramError(f"backend must be 'auto', 'native' or 'torch', got {backend!r}")
        self.layout = layout
        self.fill_id = fill_id
        self.eos_id = eos_id if layout.family == "qwen" else None
        self.primes = torch.from_numpy(layout.primes.copy())  # [L, N-1, K]
        self.offsets = torch.from_numpy(layout.offsets.copy())
        self.multipliers = torch.from_numpy(layout.multipliers.copy())  # [L, N]
        # Barrett constants floor((2^64 - 1) / p): below 2^63 for every p >= 2, so they fit in int64.
        self.magic = torch.tensor(
            [[(2**64 - 1) // int(p) for p in row] for row in layout.primes.reshape(len(layout.layer_ids), -1)],
            dtype=torch.int64,
        )
        self.backend = backend
        self._on_device: dict[torch.device, tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]] = {}
        if backend == "native" and cpu.cpu_library() is None:
            raise EngramError(
                f"the native CPU kernels are unavailable ({cpu.unavailable_reason()}); or use backend='torch'"
            )

    @property
    def context(self) -> int:
        return self.layout.max_ngram - 1

    def new_state(self, device: torch.device | str = "cpu") -> HashState:
        return HashState(
            torch.full((self.context,), self.fill_id, dtype=torch.int64, device=device),
            torch.zeros((), dtype=torch.int64, device=device),
        )

    def hash(
        self,
        compressed_ids: torch.Tensor,
        dead: torch.Tensor | None = None,
        state: HashState | None = None,
        *,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        return self.hash_with_state(compressed_ids, dead, state, out=out)[0]

    def hash_with_state(
        self,
        compressed_ids: torch.Tensor,
        dead: torch.Tensor | None = None,
        state: HashState | None = None,
        *,
        out: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, HashState]:
        """Row ids for the new tokens, and the state to pass with the request's next tokens. `out`, an
        int64 [T, layers, C] buffer the caller keeps across steps, saves allocating (and faulting in)
        a fresh output every call. On a GPU nothing here waits for the device: the blocking barriers stay
        tensors, and token ids outside the vocabulary raise the kernels' error flag instead of an error
        (engram.ops.cuda.check_error_flags); on the CPU they raise at once."""
        ids = _as_ids(compressed_ids)
        T, ctx = ids.numel(), self.context
        state = self.new_state(ids.device) if state is None else state
        ext = torch.cat([state.history.to(ids.device), ids])  # history occupies ext[0:ctx]
        position = torch.arange(ctx, ctx + T, dtype=torch.int64, device=ids.device)
        barrier = ctx - state.readable.to(ids.device)  # the lowest index of ext any new token may read
        start = barrier.expand(T)
        if dead is not None:
            dead = _as_mask(dead, T).to(ids.device)
            inclusive = torch.where(dead, position + 1, 0)
            start = torch.maximum(start, torch.cummax(inclusive, 0).values)
            barrier = torch.maximum(barrier, inclusive.max()) if T else barrier
        if self.eos_id is not None and T:
            after_eos = torch.where(ids == self.eos_id, position + 1, 0)
            exclusive = torch.cat([after_eos.new_zeros(1), torch.cummax(after_eos, 0).values[:-1]])
            start = torch.maximum(start, exclusive)
            barrier = torch.maximum(barrier, after_eos.max())
        start = start.contiguous()
        ensure_kernels(ids.device)
        out = self._output(T, out, ids.device)
        tables = self._tables(ids.device)
        if self.backend == "torch":
            check_token_ids(ids, self.layout.vocab)
            ngram_hash_reference(ext, start, *tables[:2], tables[3], self.fill_id, out)
        else:
            torch.ops.engram.ngram_hash(ext, start, *tables, self.fill_id, self.layout.vocab, out)
        total = ctx + T
        next_state = HashState(ext[total - ctx :], (total - barrier).clamp(0, ctx))
        return out, next_state

    def _tables(self, device: torch.device) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """multipliers [L, N], primes, magic and offsets [L, C] on `device` (copied once per device)."""
        if device not in self._on_device:
            L = len(self.layout.layer_ids)
            tables = (self.multipliers, self.primes.reshape(L, -1), self.magic, self.offsets.reshape(L, -1))
            self._on_device[device] = tuple(t.to(device).contiguous() for t in tables)  # type: ignore[assignment]
        return self._on_device[device]

    def _output(self, tokens: int, out: torch.Tensor | None, device: torch.device) -> torch.Tensor:
        shape = (tokens, len(self.layout.layer_ids), self.layout.columns)
        if out is None:
            return (
                empty_cpu(shape, torch.int64)
                if device.type == "cpu"
                else torch.empty(shape, dtype=torch.int64, device=device)
            )
        if out.shape != shape or out.dtype != torch.int64 or not out.is_contiguous() or out.device != device:
            raise EngramError(
                f"out must be a contiguous int64 tensor of shape {list(shape)} on {device}, got {out.dtype} {list(out.shape)} on {out.device}"
            )
        return out


def _as_ids(ids: torch.Tensor) -> torch.Tensor:
    """Shape and dtype only: the values are checked by the hash op (ops.check_token_ids, or the GPU flag)."""
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1:
        raise EngramError("token ids must be a 1-D tensor")
    if ids.dtype not in (torch.int64, torch.int32):
        raise EngramError(f"token ids must be int64 or int32, got {ids.dtype}")
    return ids.to(torch.int64).contiguous()


def _as_mask(dead: torch.Tensor, length: int) -> torch.Tensor:
    dead = torch.as_tensor(dead)
    if dead.dtype != torch.bool or dead.shape != (length,):
        raise EngramError(f"dead must be a bool tensor of shape [{length}], got {dead.dtype} {tuple(dead.shape)}")
    return dead
