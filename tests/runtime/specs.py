"""Small model specs for the runtime tests: SMALL (two fp8 tables of about 7 MB), and for the sharding
tests uneven heads, more ranks than heads, and the Qwen family."""

from __future__ import annotations

import dataclasses

from engram.ngram.spec import ModelSpec

# Two fp8 tables of about 7 MB each: large enough for page-level memory accounting, quick to load.
SMALL = ModelSpec(
    name="small",
    architecture="DeepseekV41ForCausalLM",
    hf_text_config={
        "engram_layer_ids": [1, 3],
        "engram_max_ngram_size": 3,
        "engram_n_heads": 4,
        "engram_head_dim": 128,
        "engram_vocab_size": [6_000, 7_000],
        "engram_compressed_vocab_size": 99_092,
        "engram_pad_token_id": 2,
    },
    dtype="fp8",
    tokenizer="deepseek-v4",
)

DS7 = ModelSpec(  # 7 heads: 2 ranks split them 4 + 3
    name="ds7",
    architecture="DeepseekV41ForCausalLM",
    hf_text_config={
        "engram_layer_ids": [1, 4],
        "engram_max_ngram_size": 2,
        "engram_n_heads": 7,
        "engram_head_dim": 32,
        "engram_vocab_size": [300],
        "engram_compressed_vocab_size": 500,
        "engram_pad_token_id": 2,
    },
    dtype="fp8",
)
DS3 = ModelSpec(  # 3 heads: a group of 4 falls back to row shards
    name="ds3",
    architecture="DeepseekV41ForCausalLM",
    hf_text_config={
        "engram_layer_ids": [0],
        "engram_max_ngram_size": 2,
        "engram_n_heads": 3,
        "engram_head_dim": 64,
        "engram_vocab_size": [200],
        "engram_compressed_vocab_size": 500,
        "engram_pad_token_id": 2,
    },
    dtype="bf16",
)
QWEN = ModelSpec(
    name="qwen-small",
    architecture="Qwen4ExpForCausalLM",
    hf_text_config={
        "ple_layer_ids": [1, 2],
        "ngram_size": 3,
        "heads_per_ngram": 2,
        "ngram_vocab_size_base": 500,
        "ple_embed_dim": 128,
        "vocab_size": 1000,
        "make_ngram_vocab_size_divisible_by": 16,
        "ngram_seed": 1234,
        "eos_token_id": 7,
    },
    dtype="bf16",
)
QWEN_NVFP4 = dataclasses.replace(QWEN, name="qwen-nvfp4", dtype="nvfp4")  # vLLM's NVFP4 PLE tables
SPECS = {spec.name: spec for spec in (DS7, DS3, QWEN, QWEN_NVFP4)}
