"""engram's entry point never stops vLLM: on a vLLM it serves it swaps vLLM's table classes once, however
often it is called; on any other vLLM version, or one whose Engram internals are not what engram expects,
it changes nothing of vLLM, says so once in a warning naming the version and the versions it serves, and
an engram section there is one config error, where vLLM checks its own config. Each case runs in a fresh
process of the real vLLM (tests/vllm/runner.py)."""

from __future__ import annotations

from tests.vllm.runner import ask_vllm, needs_vllm, vllm_version

pytestmark = needs_vllm
SUPPORTED = "0.32, 0.33, 0.34"


def register(**case: object) -> dict[str, object]:
    [answer] = ask_vllm("plugin_register", [case])
    return answer


def test_a_vllm_engram_serves_is_served() -> None:
    answer = register()
    swapped = ["Qwen4ExpPLEDeviceEmbedding", "Qwen4ExpPLEPinnedHostEmbedding"]
    if vllm_version() >= (0, 34):
        swapped = sorted([*swapped, "Qwen4ExpPLEDiskOffloadEmbedding"])
    assert answer == {
        "raised": None,
        "swapped": swapped,
        "factory_routed": True,
        "check_wrapped": True,
        "warnings": [],
        "without_section": None,
        "with_section": None,  # no model here: the section is checked and good (file_backed needs a model dir later)
    }


def test_another_vllm_version_is_left_as_it_is() -> None:
    answer = register(version="0.99.1")
    reason = f"engram serves vLLM {SUPPORTED} only"
    assert answer["raised"] is None
    assert (answer["swapped"], answer["factory_routed"]) == ([], False)
    assert answer["warnings"] == [
        f"engram: vLLM 0.99.1 is installed and {reason}; engram leaves vLLM as it is (an engram section is refused)"
    ]
    assert answer["without_section"] is None
    assert answer["with_section"] == (
        f"engram: vLLM 0.99.1 is installed and {reason}, so the engram section cannot be served here; install one "
        f"of vLLM {SUPPORTED} beside engram, or remove the engram section (and ENGRAM_VLLM_CONFIG)"
    )


def test_internals_engram_does_not_find_leave_vllm_as_it_is() -> None:
    """A supported version whose internals differ (one name engram imports removed): nothing is swapped or
    routed, even what could have been, and the warning names what was missing."""
    answer = register(**{"break": True})
    assert answer["raised"] is None
    assert (answer["swapped"], answer["factory_routed"]) == ([], False)
    [warning] = answer["warnings"]
    assert "its Engram internals are not what engram expects (ImportError: cannot import name " in warning
    assert "'Qwen4ExpPLEFp8EmbeddingMethod'" in warning and warning.endswith("(an engram section is refused)")
    assert answer["with_section"].startswith("engram: vLLM ")
