"""compute_hash is vLLM's digest: sha256(json.dumps(factors, sort_keys=True)), over all four fields."""

from __future__ import annotations

import hashlib
import itertools
import json

import pytest

from engram.config import ConfigError, EngramConfig, load_config

FIELDS = ("cpu_offload", "embedding_across_dp", "dp_shared_memory", "use_thp")
COMBOS = [dict(zip(FIELDS, values, strict=True)) for values in itertools.product([False, True], repeat=4)]


def is_valid(fields: dict[str, bool]) -> bool:
    if fields["dp_shared_memory"] and not fields["cpu_offload"]:
        return False
    return not (fields["use_thp"] and (not fields["cpu_offload"] or fields["dp_shared_memory"]))


@pytest.mark.parametrize("fields", COMBOS, ids=lambda f: "-".join(k for k, v in f.items() if v) or "none")
def test_every_combination(fields: dict[str, bool]) -> None:
    if not is_valid(fields):
        with pytest.raises(ConfigError):
            load_config(fields, env={})
        return
    config = load_config(fields, env={})
    assert config.hash_factors() == fields
    expected = hashlib.sha256(json.dumps(fields, sort_keys=True).encode()).hexdigest()
    assert config.compute_hash() == expected


def test_pinned_digests() -> None:
    """Literal digests, each printed by vLLM 0.33.0's own EngramConfig(...).compute_hash() for the same
    settings: a change to field names, separators or key order shows up here. dp_shared_memory hashes as
    null until it is resolved, as in vLLM. The first names (thp_packing) give the seed's digests."""
    assert EngramConfig().compute_hash() == "668023d1ec913e8ed0d03fbc3499ef9c8d8f3187aba34e730dbd44943e292e7e"
    assert EngramConfig(dp_shared_memory=False).compute_hash() == (
        "112dae6fe075f05d57782aa1c47960b7d43fd79f543097b285ee02394a5cd80a"
    )
    assert load_config({"dp_shared_memory": True}, env={}).compute_hash() == (
        "0103d4fb0b496f6466971874ca0a01faaac0bac227aafbae6f39e56a1dc1bbb0"
    )
    assert EngramConfig(use_thp=True, dp_shared_memory=False).compute_hash() == (
        "2ef9f070e324bc7b7622e65756e7fafb7005e66cc777d530a05b2dd661a6521a"
    )
    assert EngramConfig(cpu_offload=False, dp_shared_memory=False).compute_hash() == (
        "9b22d3370c673393ec0461939de47268d8a3e56bb89c4e9efa6cdeae7f859e13"
    )
    # the seed's: sha256 of the same settings under the name thp_packing (the seed had no null)
    assert EngramConfig(dp_shared_memory=False).compute_hash(older_names=True) == (
        "4ce4300125cad523fef001326f906f459aa6889959a06ac5758ad238ed3fbcec"
    )
    assert load_config({"dp_shared_memory": True}, env={}).compute_hash(older_names=True) == (
        "a56ef8a6cf7201e40893a008895a4eaff3695e00dd240da34b9d1ef61a66f083"
    )


def test_hash_is_stable_across_processes() -> None:
    import subprocess
    import sys

    code = "from engram.config import EngramConfig; print(EngramConfig(use_thp=True).compute_hash())"
    runs = {
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
        for _ in range(2)
    }
    assert runs == {EngramConfig(use_thp=True).compute_hash() + "\n"}


@pytest.mark.parametrize("field", ["file_backed", "device_cache_bytes"])
def test_placement_fields_leave_the_hash_alone(field: str) -> None:
    """Where rows are read from changes no value a lookup returns, so it is not hashed (vLLM's compile
    cache stays valid when a deployment switches to file-backed tables or a device cache)."""
    value = True if field == "file_backed" else 1 << 30
    config = load_config({field: value}, env={})
    assert getattr(config, field) == value
    assert config.hash_factors() == dict.fromkeys(FIELDS, False) | {"cpu_offload": True, "dp_shared_memory": None}
    assert config.compute_hash() == EngramConfig().compute_hash()
