"""Rows that lie in pieces: a part of a table shard (its rows, or their block scales) served where a
checkpoint stores it, split into `shard_<k>` tensors (Qwen4Exp's real checkpoints: 512 parts a table), so
the shard's rows are several views of several files, never one tensor. The CPU kernels read them in their
segmented forms (engram_gather_segments_cpu and the file reads beside it); nothing copies them into one."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from engram.errors import EngramError


@dataclass(frozen=True, eq=False)
class Segmented:
    """Rows [0, rows) of one part of a shard, in pieces: `pieces[j]` ([rows_j, width], contiguous, on the
    CPU, one dtype and width for all) holds the shard-local rows from `starts[j]` (0, then each piece's
    start the previous one's end). Reads as a 2-D tensor of rows would (shape, dtype, view) where the
    kernels take it; its bytes are never contiguous."""

    pieces: tuple[torch.Tensor, ...]
    starts: tuple[int, ...]

    def __post_init__(self) -> None:
        if not self.pieces or len(self.pieces) != len(self.starts):
            raise EngramError("internal: segmented rows need one start per piece, and at least one piece")
        first = self.pieces[0]
        at = 0
        for start, piece in zip(self.starts, self.pieces, strict=True):
            if piece.dim() != 2 or piece.dtype != first.dtype or piece.shape[1] != first.shape[1]:
                raise EngramError(
                    f"internal: pieces of segmented rows share one dtype and width; got {piece.dtype} {list(piece.shape)} beside {first.dtype} {list(first.shape)}"
                )
            if start != at or not piece.is_contiguous() or piece.device.type != "cpu" or not piece.shape[0]:
                raise EngramError(
                    "internal: pieces of segmented rows are contiguous CPU rows, each from the last's end"
                )
            at += piece.shape[0]

    @property
    def shape(self) -> torch.Size:
        return torch.Size((self.starts[-1] + self.pieces[-1].shape[0], self.pieces[0].shape[1]))

    @property
    def dtype(self) -> torch.dtype:
        return self.pieces[0].dtype

    @property
    def device(self) -> torch.device:
        return torch.device("cpu")

    @property
    def nbytes(self) -> int:
        return sum(p.nbytes for p in self.pieces)

    def dim(self) -> int:
        return 2

    def is_contiguous(self) -> bool:
        return True  # each piece is: the kernels read a row from its piece

    def element_size(self) -> int:
        return self.pieces[0].element_size()

    def numel(self) -> int:
        return self.shape[0] * self.shape[1]

    def data_ptr(self) -> int:
        """The first piece's address: where the part begins (the mapping it is in names its file)."""
        return self.pieces[0].data_ptr()

    def view(self, dtype: torch.dtype) -> Segmented:
        """The same rows read as `dtype` (torch.Tensor.view's rule for the last dimension)."""
        return Segmented(tuple(p.view(dtype) for p in self.pieces), self.starts)

    def bases(self) -> list[int]:
        """Each piece's address."""
        return [p.data_ptr() for p in self.pieces]

    def piece_of(self, local: torch.Tensor) -> torch.Tensor:
        """The piece holding each shard-local row of `local` (int64, in [0, rows))."""
        return torch.searchsorted(torch.tensor(self.starts), local, right=True) - 1


Rows = torch.Tensor | Segmented


def row_addresses(part: Rows, local: torch.Tensor) -> torch.Tensor:
    """The address of each shard-local row of `local` (int64, in [0, rows)) of `part`."""
    row_bytes = part.shape[1] * part.element_size()
    if isinstance(part, torch.Tensor):
        return part.data_ptr() + local * row_bytes
    piece = part.piece_of(local)
    return torch.tensor(part.bases())[piece] + (local - torch.tensor(part.starts)[piece]) * row_bytes


def pieces_of(part: Rows) -> list[tuple[int, torch.Tensor]]:
    """(shard-local start, rows) of each piece of `part`: one, for rows in one tensor."""
    return [(0, part)] if isinstance(part, torch.Tensor) else list(zip(part.starts, part.pieces, strict=True))


def bases_at(part: Rows, starts: tuple[int, ...]) -> list[int]:
    """The address of shard-local row `starts[j]` of `part`, for each j: a segmented part's pieces (split
    where `starts` says), or rows in one tensor seen as pieces (block scales kept in private memory beside
    rows that stay in pieces)."""
    if isinstance(part, Segmented):
        if part.starts != starts:
            raise EngramError("internal: a shard's rows and scales are split at different rows")
        return part.bases()
    row_bytes = part.shape[1] * part.element_size()
    return [part.data_ptr() + start * row_bytes for start in starts]


def dense(rows: Rows) -> torch.Tensor:
    """`rows` as the one tensor they are: for the paths that hold tables in memory (a GPU's kernels, a
    loaded table), never rows in pieces of a checkpoint's files."""
    if isinstance(rows, Segmented):
        raise EngramError(
            f"internal: rows in {len(rows.pieces)} pieces of a checkpoint's files reached a path for tables in memory"
        )
    return rows


def as_parameter(rows: Rows) -> torch.Tensor:
    """A tensor for an engine that keeps each table's rows as a parameter: the rows themselves, or for rows
    in pieces one of their shape and dtype that holds no memory (a stride-0 view of one row of zeros).
    Nothing reads it: lookups read the table's pieces."""
    if isinstance(rows, torch.Tensor):
        return rows
    return torch.zeros((1, rows.shape[1]), dtype=rows.dtype).expand(rows.shape[0], rows.shape[1])
