"""What an EngramConfig does beyond the rules JSON Schema states, written once here and tested: its
vLLM-compatible digest, the checks against the rest of a deployment that vLLM's EngramConfig makes as
methods, the size of its embedding group, how a null dp_shared_memory resolves, and the host-memory
check. The generated EngramConfig inherits it and supplies what the schema says as class attributes:
the fields the digest covers and their first names, the document check, and the message for a missing
model. No logic lives in a template."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Callable
from typing import Any, ClassVar, Protocol, Self

import msgspec

from engram.errors import ConfigError, EngramError, Problem


class Parallel(Protocol):
    """The parallel part of a deployment, as far as these methods read it (the generated ParallelConfig)."""

    @property
    def tensor_parallel_size(self) -> int: ...
    @property
    def data_parallel_size(self) -> int: ...
    @property
    def enable_elastic_ep(self) -> bool: ...


class EngramConfigBehaviour:
    """The methods of the generated EngramConfig (module docstring)."""

    __slots__ = ()

    HASHED: ClassVar[tuple[str, ...]]  # the fields that change what a lookup returns, in schema order
    VLLM_FIELDS: ClassVar[tuple[str, ...]]  # the fields any vLLM version's EngramConfig has, in schema order
    VLLM_VERSIONS: ClassVar[dict[str, tuple[str, ...]]]  # vLLM version -> the fields its EngramConfig has
    FIRST_NAMES: ClassVar[dict[str, str]]  # field -> the name the seed's EngramConfig hashed it under
    NO_MODEL: ClassVar[str]  # the message when no model config is given
    check_document: ClassVar[Callable[..., bool]]  # (document, path, problems): the generated walk

    cpu_offload: bool
    embedding_across_dp: bool
    dp_shared_memory: bool | None
    use_thp: bool
    file_backed: bool

    def hash_factors(self, *, vllm: str | None = None, older_names: bool = False) -> dict[str, Any]:
        """The fields the digest covers, by name: those of vLLM `vllm`'s EngramConfig (digest_version) and
        any hashed field of engram's own (today none: each says where rows live, and opts out), or with
        `older_names` the oldest version's under the names they had first (as the seed's hashed them)."""
        version = self.digest_version(vllm, older_names=older_names)
        names = self.VLLM_VERSIONS[version]
        names += tuple(name for name in self.HASHED if name not in self.VLLM_FIELDS)
        factors = {name: getattr(self, name) for name in self.HASHED if name in names}
        if older_names:
            factors = {self.FIRST_NAMES.get(name, name): value for name, value in factors.items()}
        return factors

    def compile_factors(self) -> dict[str, Any]:
        """vLLM 0.34's EngramConfig.compile_factors(), for code written against it: every field of the newest
        vLLM EngramConfig the schema knows, by name, as set here (what VllmConfig.compile_factors() nests
        under "engram"). hash_factors(vllm=...) gives each version's digest factors, earlier ones' too."""
        return {name: getattr(self, name) for name in self.VLLM_VERSIONS[list(self.VLLM_VERSIONS)[-1]]}

    def compute_hash(self, *, vllm: str | None = None, older_names: bool = False) -> str:
        """vLLM's digest of these settings, sha256 of json.dumps(hash_factors(), sort_keys=True): vLLM 0.34's
        of EngramConfig.compile_factors() (the newest version the schema knows, by default), vLLM 0.32's
        and 0.33's compute_hash(), or with `older_names` the seed's."""
        factors = json.dumps(self.hash_factors(vllm=vllm, older_names=older_names), sort_keys=True)
        return hashlib.sha256(factors.encode()).hexdigest()

    def digest_version(self, vllm: str | None = None, *, older_names: bool = False) -> str:
        """The vLLM version (major.minor, a key of VLLM_VERSIONS) whose digest compute_hash gives: `vllm`
        ("0.33", or a full version such as "0.33.0"), the newest by default, the oldest with `older_names`.
        A version whose EngramConfig lacks a field set away from its default here is refused: its digest
        could not tell the two configs apart."""
        known = list(self.VLLM_VERSIONS)
        if vllm is None:
            version = known[0] if older_names else known[-1]
        else:
            version = ".".join(str(vllm).split("+")[0].split(".")[:2])
            if version not in self.VLLM_VERSIONS:
                raise EngramError(f"engram knows the EngramConfig digests of vLLM {', '.join(known)}, not of {vllm!r}")
        defaults = type(self).__struct_defaults__  # type: ignore[attr-defined]
        fields = type(self).__struct_fields__  # type: ignore[attr-defined]
        for name in self.VLLM_FIELDS:
            if name not in self.VLLM_VERSIONS[version] and getattr(self, name) != defaults[fields.index(name)]:
                newer = next(v for v in known if name in self.VLLM_VERSIONS[v])
                raise EngramError(
                    f"{name} is a field of vLLM {newer}'s EngramConfig, not {version}'s, whose digest cannot include it; ask for vLLM {newer}'s digest"
                )
        return version

    def digest_name(self, vllm: str | None = None, *, older_names: bool = False) -> str:
        """What compute_hash(vllm, older_names) is the digest of, in words (`engram hash` prints it)."""
        version = self.digest_version(vllm, older_names=older_names)
        if older_names:
            return "the seed's EngramConfig.compute_hash(), the fields under their first names"
        # vLLM 0.34 replaced compute_hash() by compile_factors(), nested under "engram" in VllmConfig's.
        method = "compute_hash()" if tuple(map(int, version.split("."))) < (0, 34) else "compile_factors()"
        return f"vLLM {version}'s EngramConfig.{method}"

    def verify_model_config(self, model: msgspec.Struct | None, platform: str | None = None) -> None:
        """Reject a model without n-gram embeddings, or a platform without an Engram backend.
        `platform=None` leaves the platform unchecked."""
        if model is None:
            raise ConfigError([Problem("/model", "model-architecture", self.NO_MODEL)])
        parts: dict[str, Any] = {"model": msgspec.to_builtins(model)}
        if platform is not None:
            parts["platform"] = platform
        self._verify(parts)

    def verify_parallel_config(self, parallel: msgspec.Struct) -> None:
        """Reject parallel topologies this config cannot run on."""
        self._verify({"parallel": msgspec.to_builtins(parallel)})

    def verify_load_config(self, load: msgspec.Struct) -> None:
        """Shared tables need a loader that calls each parameter's weight loader."""
        self._verify({"load": msgspec.to_builtins(load)})

    def get_parallel_size(self, parallel: Parallel) -> int:
        """Size of the embedding group: TP, times DP when tables are sharded across replicas."""
        size = parallel.tensor_parallel_size
        if self.embedding_across_dp and parallel.data_parallel_size > 1:
            size *= parallel.data_parallel_size
        return size

    def resolve_dp_shared_memory(self, parallel: Parallel) -> Self:
        """This config with dp_shared_memory resolved as vLLM 0.33 resolves null: on exactly when
        cpu_offload, not use_thp, data_parallel_size > 1 and no elastic EP (and, here, not file_backed,
        whose pages are one copy per node already). An explicit value is kept."""
        if self.dp_shared_memory is not None:
            return self
        resolved: Self = msgspec.structs.replace(self, dp_shared_memory=shares_host_memory(self, parallel))  # type: ignore[type-var]
        return resolved

    def verify_host_memory(self, table_bytes: int, parallel: Any, limits: Any = None) -> None:
        """Reject private host tables that would not fit in one node's memory (engram.memory.host), with a
        null dp_shared_memory resolved against `parallel` first."""
        from engram.memory.host import verify_host_memory

        verify_host_memory(self.resolve_dp_shared_memory(parallel), table_bytes, parallel, limits)

    def _verify(self, parts: dict[str, Any]) -> None:
        problems: list[Problem] = []
        type(self).check_document({"engram": msgspec.to_builtins(self), **parts}, "", problems)
        if problems:
            raise ConfigError(problems)


NULL_RESOLUTION = "on exactly when cpu_offload, not use_thp, not file_backed, data_parallel_size > 1 and no elastic EP"


def shares_host_memory(config: EngramConfigBehaviour, parallel: Parallel) -> bool:
    """What a null dp_shared_memory means on `parallel` (NULL_RESOLUTION: vLLM 0.33's, and not file_backed)."""
    return bool(
        config.cpu_offload
        and not config.use_thp
        and not config.file_backed
        and parallel.data_parallel_size > 1
        and not parallel.enable_elastic_ep
    )
