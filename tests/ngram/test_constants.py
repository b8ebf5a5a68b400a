"""Every public constant of the two n-gram families: DeepSeek V4.1-Flash's and the Engram demo's primes
and multipliers, Qwen4Exp's sizes and multipliers, and the toy case."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from engram.apps.presets import PRESETS, get_preset
from engram.config import ModelConfig, load_config
from engram.errors import EngramError
from engram.ngram.hash import NgramHasher
from engram.ngram.layout import deepseek_layout, qwen_layout
from engram.ngram.spec import ModelSpec
from engram.ngram.vocab import compressed_lookup, deepseek_v4_tokenizer_file

BACKENDS = ["native", "torch"]


def test_deepseek_v4_compressed_vocabulary() -> None:
    lookup = compressed_lookup(deepseek_v4_tokenizer_file())
    assert lookup.numel() == 129_280
    assert int(lookup.max()) + 1 == 99_092
    assert lookup[:3].tolist() == [0, 1, 2]  # the pad (raw 2) stays compressed 2


def test_v41_layout() -> None:
    layout = get_preset("deepseek-v4.1-flash").layout
    layer1, layer14 = layout.primes.reshape(2, -1)
    assert layer1[:3].tolist() == [16000057, 16000079, 16000081] and int(layer1[-1]) == 16000463
    assert int(layer14[0]) == 16000477 and int(layer14[-1]) == 16000889
    assert len(set(layout.primes.ravel().tolist())) == 48
    assert layout.table_rows == (384_006_168, 384_016_682)
    assert get_preset("deepseek-v4.1-flash").table_bytes == 202_758_032_400
    assert layout.multipliers.tolist() == [
        [76632096046245, 4839876093313, 35959672319349, 73987337458391],
        [67716810739261, 51510806800915, 30921347202721, 82619226485591],
    ]


def test_engram_demo_layout() -> None:
    layout = get_preset("engram-demo-v1").layout
    assert layout.primes[0, 0].tolist() == [646403, 646411, 646421, 646423, 646433, 646453, 646519, 646523]
    assert layout.table_rows == (10_344_164, 10_348_242)


def test_layer_order_matters_for_primes_and_ids_for_multipliers() -> None:
    forward = deepseek_layout((1, 14), 4, 8, (16_000_000,) * 3, 99_092)
    backward = deepseek_layout((14, 1), 4, 8, (16_000_000,) * 3, 99_092)
    assert backward.primes[0].tolist() == forward.primes[0].tolist()  # the first layer listed takes the first primes
    assert backward.multipliers[0].tolist() == forward.multipliers[1].tolist()  # multipliers follow the layer id


TOY = deepseek_layout((0, 3), 3, 2, (11, 11), 7)
TOY_IDS = torch.tensor([3, 1, 4, 1, 5, 6, 2])


def test_toy_primes() -> None:
    assert TOY.primes.tolist() == [[[11, 13], [17, 19]], [[23, 29], [31, 37]]]


@pytest.mark.parametrize("backend", BACKENDS)
def test_toy_vector(backend: str) -> None:
    hasher = NgramHasher(TOY, fill_id=0, backend=backend)
    local = hasher.hash(TOY_IDS)[:, 0, :] - torch.from_numpy(TOY.offsets[0].reshape(-1))
    assert local.tolist() == [
        [7, 1, 6, 3],
        [8, 9, 0, 8],
        [2, 11, 1, 10],
        [9, 11, 5, 17],
        [2, 0, 15, 3],
        [10, 0, 7, 9],
        [5, 5, 0, 7],
    ]
    dead = torch.zeros(7, dtype=torch.bool)
    dead[3] = True
    assert hasher.hash(TOY_IDS, dead)[:, 0, :].tolist() == [
        [7, 12, 30, 44],
        [8, 20, 24, 49],
        [2, 22, 25, 51],
        [0, 11, 24, 41],
        [8, 17, 34, 46],
        [10, 11, 39, 47],
        [5, 16, 24, 48],
    ]


def test_qwen_layout() -> None:
    layout = qwen_layout((1,), 3, 8, 20_000_000, 248_320, 128, 1234)
    sizes = layout.primes.ravel()
    assert (int(sizes[0]), int(sizes[-1]), sizes.size, int(sizes.sum())) == (20000003, 20000171, 16, 320_001_446)
    assert layout.table_rows == (320_001_536,)
    assert layout.multipliers.tolist() == [[23703573157769, 20109073645365, 8052911324071]]
    shared = qwen_layout((1, 5), 3, 8, 20_000_000, 248_320, 128, 1234, "shared")
    assert shared.primes[0].tolist() == layout.primes[0].tolist()  # global head g takes the (g+1)-th prime
    assert int(shared.offsets[1, 0, 0]) == 320_001_446  # one table: layer 2 starts where layer 1 ends
    assert shared.table_rows == (640_006_528,) and shared.table_of_layer == (0, 0)
    assert np.all(shared.primes[1] > shared.primes[0].max())


def test_qwen_per_layer_tables_match_vllm() -> None:
    """vLLM 0.33 (Qwen4ExpNGramEmbedding._make_vocab_layout / _make_layer_multipliers): each layer its own
    table from offset 0, padded, with primes and multipliers by the layer's rank among the sorted ids."""
    layout = qwen_layout((5, 1), 3, 8, 20_000_000, 248_320, 128, 1234)
    assert layout.table_of_layer == (0, 1)
    assert layout.table_rows == (320_005_120, 320_001_536)
    assert [int(layout.offsets[i, 0, 0]) for i in (0, 1)] == [0, 0]
    assert int(layout.offsets[0, 1, 7]) == int(layout.primes[0].sum() - layout.primes[0, 1, 7])
    assert (int(layout.primes[0, 0, 0]), int(layout.primes[0, 1, 7])) == (20_000_213, 20_000_429)
    assert (int(layout.primes[1, 0, 0]), int(layout.primes[1, 1, 7])) == (20_000_003, 20_000_171)
    assert layout.multipliers.tolist() == [
        [3352040966061, 19752442147475, 10742103100073],
        [23703573157769, 20109073645365, 8052911324071],
    ]


@pytest.mark.parametrize("name", sorted(PRESETS))
def test_presets_validate_and_ship_matching_multipliers(name: str) -> None:
    spec = get_preset(name)
    load_config(env={}).verify_model_config(spec.model_config(), "cuda")
    assert spec.layout.multipliers.shape == (len(spec.layer_ids), spec.max_ngram)
    assert np.all(spec.layout.multipliers % 2 == 1)


def test_demo_preset_is_about_256_mb() -> None:
    assert 240e6 < get_preset("demo").table_bytes < 280e6
    assert get_preset("tiny").table_bytes < 1e6


def test_spec_from_model_config() -> None:
    preset = get_preset("deepseek-v4.1-flash")
    spec = ModelSpec.from_model_config(preset.model_config())
    assert spec.layout.table_rows == preset.layout.table_rows and spec.head_dim == 256 and spec.fill_id == 2
    assert spec.layout.multipliers.tolist() == preset.layout.multipliers.tolist()
    with pytest.raises(EngramError, match="architecture 'LlamaForCausalLM' carries no n-gram embeddings"):
        ModelSpec.from_model_config(ModelConfig(architecture="LlamaForCausalLM"))
