"""A model's n-gram embedding spec, read from its HF text config: which layers, how many orders and heads,
the bucket sizes, the tokenizer, and the row format of its checkpoint tables."""

from __future__ import annotations

import functools
from dataclasses import dataclass, field
from typing import Any

import torch

from engram.config import ModelConfig
from engram.errors import EngramError
from engram.ngram.hash import NgramHasher
from engram.ngram.layout import Family, Layout, QwenTables, deepseek_layout, qwen_layout
from engram.ngram.vocab import compressed_lookup, deepseek_v4_tokenizer_file
from engram.ops.formats import FORMATS

FAMILIES: dict[str, Family] = {
    "DeepseekV41ForCausalLM": "deepseek",
    "Qwen4ExpForCausalLM": "qwen",
    "Qwen4ExpForConditionalGeneration": "qwen",
}
QWEN_PREFIX = "model.language_model"


@dataclass(frozen=True, eq=False)
class ModelSpec:
    name: str
    architecture: str
    hf_text_config: dict[str, Any]
    dtype: str = "fp8"
    tokenizer: str | None = None  # "deepseek-v4", or None where ids come compressed (or need none: Qwen)
    multipliers: dict[int, tuple[int, ...]] = field(default_factory=dict)  # shipped as data, checked on use
    ple_tables: QwenTables = "per-layer"  # Qwen: vLLM 0.33's table per layer, or the seed's one shared table

    @property
    def family(self) -> Family:
        try:
            return FAMILIES[self.architecture]
        except KeyError:
            raise EngramError(f"architecture {self.architecture!r} carries no n-gram embeddings") from None

    def _get(self, *names: str, default: Any = None) -> Any:
        for name in names:
            if name in self.hf_text_config:
                return self.hf_text_config[name]
        if default is None:
            raise EngramError(f"{self.name}: hf_text_config lacks {names[0]!r}")
        return default

    @property
    def layer_ids(self) -> tuple[int, ...]:
        return tuple(self._get("engram_layer_ids" if self.family == "deepseek" else "ple_layer_ids"))

    @property
    def max_ngram(self) -> int:
        return int(self._get("engram_max_ngram_size" if self.family == "deepseek" else "ngram_size"))

    @property
    def heads(self) -> int:
        return int(self._get("engram_n_heads" if self.family == "deepseek" else "heads_per_ngram"))

    @property
    def head_dim(self) -> int:
        if self.family == "deepseek":
            return int(self._get("engram_head_dim"))
        return int(self._get("ple_embed_dim")) // ((self.max_ngram - 1) * self.heads)

    @property
    def vocab(self) -> int:
        """Ids the hash sees: V' (compressed) for DeepSeek, the raw vocabulary for Qwen."""
        return int(self._get("engram_compressed_vocab_size" if self.family == "deepseek" else "vocab_size"))

    @functools.cached_property
    def layout(self) -> Layout:
        if self.family == "deepseek":
            base = self._get("engram_vocab_size")
            bases = tuple(base) if isinstance(base, list | tuple) else (int(base),) * (self.max_ngram - 1)
            layout = deepseek_layout(
                self.layer_ids, self.max_ngram, self.heads, bases, self.vocab, int(self._get("engram_seed", default=0))
            )
        else:
            layout = qwen_layout(
                self.layer_ids,
                self.max_ngram,
                self.heads,
                int(self._get("ngram_vocab_size_base")),
                self.vocab,
                int(self._get("make_ngram_vocab_size_divisible_by", default=1)),
                int(self._get("seed", "ngram_seed", default=1234)),  # vLLM reads `seed`; `ngram_seed` is older
                self.ple_tables,
            )
        for position, layer_id in enumerate(self.layer_ids):
            stored = self.multipliers.get(layer_id)
            if stored is not None and tuple(int(m) for m in layout.multipliers[position]) != stored:
                raise EngramError(
                    f"{self.name}: derived multipliers of layer {layer_id} differ from the shipped ones (NumPy changed its generator?)"
                )
        return layout

    # -- tokens -------------------------------------------------------------------------------------

    @functools.cached_property
    def lookup(self) -> torch.Tensor | None:
        """raw -> compressed ids (None for Qwen: no compression). Checked against V'."""
        if self.family == "qwen":
            return None
        if self.tokenizer != "deepseek-v4":
            raise EngramError(f"{self.name}: its tokenizer is not bundled; pass compressed ids instead of raw ones")
        lookup = compressed_lookup(deepseek_v4_tokenizer_file())
        found = int(lookup.max()) + 1
        if found != self.vocab:
            raise EngramError(
                f"{self.name}: the tokenizer compresses to {found} ids, but engram_compressed_vocab_size is {self.vocab}"
            )
        return lookup

    @property
    def raw_vocab(self) -> int:
        return self.vocab if self.lookup is None else self.lookup.numel()

    def compress(self, raw_ids: torch.Tensor) -> torch.Tensor:
        raw_ids = torch.as_tensor(raw_ids, dtype=torch.int64)
        size = self.raw_vocab
        bad = raw_ids[(raw_ids < 0) | (raw_ids >= size)]
        if bad.numel():
            raise EngramError(f"token id {int(bad[0])} is outside the tokenizer's {size} ids (0..{size - 1})")
        return raw_ids.clone() if self.lookup is None else self.lookup[raw_ids]

    @property
    def fill_id(self) -> int:
        """What blocked lookbacks read: the pad's compressed id (DeepSeek) or EOS (Qwen)."""
        if self.family == "qwen":
            return int(self._get("eos_token_id"))
        pad = int(self._get("engram_pad_token_id", "engram_pad_id"))
        if self.tokenizer is None:
            return pad  # ids arrive compressed; DeepSeek tokenizers keep their leading special ids distinct
        return int(self.compress(torch.tensor([pad]))[0])

    def hasher(self, backend: str = "auto") -> NgramHasher:
        return NgramHasher(
            self.layout,
            self.fill_id,
            int(self._get("eos_token_id")) if self.family == "qwen" else None,
            backend=backend,
        )

    # -- tables -------------------------------------------------------------------------------------

    @property
    def row_bytes(self) -> int:
        """Bytes of one table row in the checkpoint format, block scales included."""
        return FORMATS[self.dtype].row_bytes(self.head_dim)

    @property
    def table_bytes(self) -> int:
        return sum(self.layout.table_rows) * self.row_bytes

    def table_names(self) -> list[str]:
        """Checkpoint tensor prefixes, one per table: `{prefix}.weight` and its format's scales.
        Qwen's per-layer tables take vLLM's names: the module of 1-based layer L sits on `layers.{L-1}`."""
        if self.family == "deepseek":
            return [f"layers.{i}.engram.embed" for i in self.layer_ids]
        if self.ple_tables == "shared":
            return ["ple.embed"]
        return [f"{QWEN_PREFIX}.layers.{i - 1}.ple.ple_embedding.ngram_embedding" for i in self.layer_ids]

    def model_config(self) -> ModelConfig:
        return ModelConfig(architecture=self.architecture, hf_text_config=dict(self.hf_text_config))

    @classmethod
    def from_model_config(cls, model: ModelConfig, *, dtype: str = "fp8", tokenizer: str | None = None) -> ModelSpec:
        """The spec of a served model, from its (validated) ModelConfig. `tokenizer="deepseek-v4"` lets
        it compress raw ids; otherwise ids arrive compressed (DeepSeek) or need no compression (Qwen)."""
        spec = cls(
            name=model.architecture,
            architecture=model.architecture,
            hf_text_config=dict(model.hf_text_config),
            dtype=dtype,
            tokenizer=tokenizer,
        )
        spec.family  # noqa: B018 - an unsupported architecture fails here, not at first use
        return spec
