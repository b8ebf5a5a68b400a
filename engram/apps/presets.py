"""Model presets: the n-gram fields of each production model's HF text config, plus two small models
that keep every DeepSeek rule with tiny tables (`tiny` for tests, `demo` for the demo)."""

from __future__ import annotations

import dataclasses

from engram.errors import EngramError
from engram.ngram.spec import ModelSpec

DEEPSEEK = "DeepseekV41ForCausalLM"

PRESETS: dict[str, ModelSpec] = {
    spec.name: spec
    for spec in (
        ModelSpec(
            name="deepseek-v4.1-flash",
            architecture=DEEPSEEK,
            hf_text_config={
                "engram_layer_ids": [1, 14],
                "engram_max_ngram_size": 4,
                "engram_n_heads": 8,
                "engram_head_dim": 256,
                "engram_vocab_size": 16_000_000,
                "engram_compressed_vocab_size": 99_092,
                "engram_pad_token_id": 2,
                "vocab_size": 129_280,
            },
            dtype="fp8",
            tokenizer="deepseek-v4",
            multipliers={
                1: (76632096046245, 4839876093313, 35959672319349, 73987337458391),
                14: (67716810739261, 51510806800915, 30921347202721, 82619226485591),
            },
        ),
        ModelSpec(
            # The original Engram demo (engram_demo_v1): DeepSeek V3 tokenizer, which is not bundled,
            # so this preset hashes compressed ids only.
            name="engram-demo-v1",
            architecture=DEEPSEEK,
            hf_text_config={
                "engram_layer_ids": [1, 15],
                "engram_max_ngram_size": 3,
                "engram_n_heads": 8,
                "engram_head_dim": 64,
                "engram_vocab_size": [646_400, 646_400],
                "engram_compressed_vocab_size": 98_627,
                "engram_pad_id": 2,
            },
            dtype="bf16",
        ),
        ModelSpec(
            # Qwen4Exp PLE: one table per PLE layer (as vLLM 0.33 has it), 80-dim bf16 heads (160-byte rows, 51 GB).
            # eos_token_id is the <|endoftext|> id of the 248,320-id Qwen vocabulary family; set the
            # model's own value in hf_text_config if it differs.
            name="qwen4-exp-ple",
            architecture="Qwen4ExpForCausalLM",
            hf_text_config={
                "ple_layer_ids": [1],
                "ngram_size": 3,
                "heads_per_ngram": 8,
                "ngram_vocab_size_base": 20_000_000,
                "ple_embed_dim": 1280,
                "vocab_size": 248_320,
                "make_ngram_vocab_size_divisible_by": 128,
                "seed": 1234,
                "eos_token_id": 248_044,
            },
            dtype="bf16",
            multipliers={1: (23703573157769, 20109073645365, 8052911324071)},
        ),
        ModelSpec(
            name="tiny",
            architecture=DEEPSEEK,
            hf_text_config={
                "engram_layer_ids": [1, 3],
                "engram_max_ngram_size": 3,
                "engram_n_heads": 4,
                "engram_head_dim": 32,
                "engram_vocab_size": [1_000, 1_500],
                "engram_compressed_vocab_size": 99_092,
                "engram_pad_token_id": 2,
            },
            dtype="fp8",
            tokenizer="deepseek-v4",
        ),
        ModelSpec(
            name="demo",
            architecture=DEEPSEEK,
            hf_text_config={
                "engram_layer_ids": [2, 6],
                "engram_max_ngram_size": 3,
                "engram_n_heads": 8,
                "engram_head_dim": 128,
                "engram_vocab_size": 62_000,  # one base for every order, as vLLM 0.33 reads it
                "engram_compressed_vocab_size": 99_092,
                "engram_pad_token_id": 2,
            },
            dtype="fp8",
            tokenizer="deepseek-v4",
        ),
    )
}


def scaled_preset(name: str, table_bytes: int) -> ModelSpec:
    """A DeepSeek-family preset with its bucket sizes scaled so its tables hold about `table_bytes`: the
    same row format, heads, orders and hash, for benchmarks of a given table size."""
    base = get_preset(name)
    if base.family != "deepseek":
        raise EngramError(f"only DeepSeek-family presets scale; {name!r} is {base.family}")
    factor = table_bytes / base.table_bytes
    config = dict(base.hf_text_config)
    sizes = config["engram_vocab_size"]
    config["engram_vocab_size"] = (
        [max(1, round(v * factor)) for v in sizes] if isinstance(sizes, list) else max(1, round(sizes * factor))
    )
    return dataclasses.replace(base, name=f"{name}@{table_bytes / 2**30:.1f}GiB", hf_text_config=config)


def get_preset(name: str) -> ModelSpec:
    try:
        return PRESETS[name]
    except KeyError:
        raise EngramError(f"unknown preset {name!r}; choose one of: {', '.join(PRESETS)}") from None
