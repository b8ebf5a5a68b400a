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

from engram import native
from engram.errors import EngramError
from engram.ngram.layout import Layout


@dataclass(frozen=True)
class HashState:
    """What a request carries between steps: its last N-1 compressed ids and how many of them the next
    token may still read (0 for a fresh request: before the first token everything reads the fill)."""

    history: torch.Tensor  # int64 [N-1], oldest first
    readable: int


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
        self.library = None if backend == "torch" else native.cpu_library()
        if backend == "native" and self.library is None:
            raise EngramError("the native CPU kernels could not be built; see the log, or use backend='torch'")

    @property
    def context(self) -> int:
        return self.layout.max_ngram - 1

    def new_state(self) -> HashState:
        return HashState(torch.full((self.context,), self.fill_id, dtype=torch.int64), 0)

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
        a fresh output every call."""
        ids = _as_ids(compressed_ids, self.layout.vocab)
        T, ctx = ids.numel(), self.context
        state = self.new_state() if state is None else state
        ext = torch.cat([state.history, ids])  # history occupies ext[0:ctx]
        position = torch.arange(ctx, ctx + T, dtype=torch.int64)
        start = torch.full((T,), ctx - state.readable, dtype=torch.int64)
        barrier_next = ctx - state.readable
        if dead is not None:
            dead = _as_mask(dead, T)
            inclusive = torch.where(dead, position + 1, 0)
            start = torch.maximum(start, torch.cummax(inclusive, 0).values)
            barrier_next = max(barrier_next, int(inclusive.max()) if T else 0)
        if self.eos_id is not None and T:
            after_eos = torch.where(ids == self.eos_id, position + 1, 0)
            exclusive = torch.cat([after_eos.new_zeros(1), torch.cummax(after_eos, 0).values[:-1]])
            start = torch.maximum(start, exclusive)
            barrier_next = max(barrier_next, int(after_eos.max()))
        out = self._output(T, out)
        if self.library is None:
            self._rows(ext, position, start, out)
        else:
            self._rows_native(ext, start, out)
        rows = out
        total = ctx + T
        next_state = HashState(ext[total - ctx :].clone(), max(0, min(ctx, total - barrier_next)))
        return rows, next_state

    def _output(self, tokens: int, out: torch.Tensor | None) -> torch.Tensor:
        shape = (tokens, len(self.layout.layer_ids), self.layout.columns)
        if out is None:
            return torch.empty(shape, dtype=torch.int64)
        if out.shape != shape or out.dtype != torch.int64 or not out.is_contiguous() or out.device.type != "cpu":
            raise EngramError(
                f"out must be a contiguous int64 CPU tensor of shape {list(shape)}, got {out.dtype} {list(out.shape)}"
            )
        return out

    def _rows_native(self, ext: torch.Tensor, start: torch.Tensor, out: torch.Tensor) -> None:
        layout = self.layout
        tokens = start.numel()
        status = self.library.engram_ngram_hash_cpu(  # type: ignore[union-attr]
            native.ptr(ext), native.ptr(start), tokens, self.context, native.ptr(self.multipliers),
            native.ptr(self.primes), native.ptr(self.magic), native.ptr(self.offsets),
            len(layout.layer_ids), layout.max_ngram, layout.heads, self.fill_id, native.ptr(out), torch.get_num_threads(),
        )  # fmt: skip
        native.check(status, "engram_ngram_hash_cpu")

    def _rows(self, ext: torch.Tensor, position: torch.Tensor, start: torch.Tensor, out: torch.Tensor) -> None:
        layout = self.layout
        by_order = out.view(position.numel(), len(layout.layer_ids), layout.max_ngram - 1, layout.heads)
        mix = None
        for k in range(layout.max_ngram):
            at = position - k
            word = torch.where(at >= start, ext[at], self.fill_id)
            term = word[:, None] * self.multipliers[None, :, k]  # [T, L]; < 2^63 by the multiplier bound
            mix = term if mix is None else mix ^ term
            if k >= 1:
                by_order[:, :, k - 1, :] = (
                    torch.remainder(mix[:, :, None], self.primes[None, :, k - 1, :]) + self.offsets[None, :, k - 1, :]
                )


def _as_ids(ids: torch.Tensor, vocab: int) -> torch.Tensor:
    if not isinstance(ids, torch.Tensor) or ids.dim() != 1:
        raise EngramError("token ids must be a 1-D tensor")
    if ids.dtype not in (torch.int64, torch.int32):
        raise EngramError(f"token ids must be int64 or int32, got {ids.dtype}")
    ids = ids.to(torch.int64).cpu()
    # Out-of-range ids would overflow the multiply (the bound assumes id < vocab): refuse them.
    if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= vocab):
        bad = ids[(ids < 0) | (ids >= vocab)][0]
        raise EngramError(f"compressed id {int(bad)} is outside [0, {vocab}); compress raw token ids first")
    return ids


def _as_mask(dead: torch.Tensor, length: int) -> torch.Tensor:
    dead = torch.as_tensor(dead)
    if dead.dtype != torch.bool or dead.shape != (length,):
        raise EngramError(f"dead must be a bool tensor of shape [{length}], got {dead.dtype} {tuple(dead.shape)}")
    return dead
