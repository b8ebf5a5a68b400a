"""The op layer: the torch ops engram::gather, engram::gather_into and engram::ngram_hash (library), the
checks every call passes (checks), the kernels' id forms (ids), plain-torch references (reference), the
CPU twins (cpu) and the CUDA kernels (cuda, imported on a GPU's first op by devices.ensure_kernels), and
the build of both native libraries (build)."""

from engram.ops.checks import DEAD_ID, OUT_KINDS, SCALE_BLOCK, SCALE_DTYPE, GatherCall, check_ids, check_token_ids
from engram.ops.dispatch import HASHERS, LAUNCHERS, run_gather
from engram.ops.ids import kernel_ids, sort_ids, use_sorted
from engram.ops.library import gather, gather_into, ngram_hash
from engram.ops.reference import gather_reference, ngram_hash_reference

__all__ = [
    "DEAD_ID",
    "HASHERS",
    "LAUNCHERS",
    "OUT_KINDS",
    "SCALE_BLOCK",
    "SCALE_DTYPE",
    "GatherCall",
    "check_ids",
    "check_token_ids",
    "gather",
    "gather_into",
    "gather_reference",
    "kernel_ids",
    "ngram_hash",
    "ngram_hash_reference",
    "run_gather",
    "sort_ids",
    "use_sorted",
]
