"""vLLM 0.33 calls the huge-page field use_thp; thp_packing, its first name here, is still read from every
input (documents, --engram-config JSON, dotted flags, FIELD=VALUE overrides), and the seed's digest, which
hashed it under that name, is one flag away."""

from __future__ import annotations

import pytest

from engram.cli import main
from engram.config import EngramConfig, load_config, load_deployment
from engram.errors import ConfigError, Problem


def test_the_older_name_is_read_from_every_input() -> None:
    given = {"thp_packing": True}
    assert load_config(given, env={}) == EngramConfig(use_thp=True)
    assert given == {"thp_packing": True}  # the caller's dict is left alone
    assert load_config(b'{"thp_packing": true}', env={}) == EngramConfig(use_thp=True)
    assert load_config({}, env={}, overrides=["thp_packing=yes"]) == EngramConfig(use_thp=True)
    assert load_deployment({}, env={}, engram_json=['{"thp_packing": true}']).engram.use_thp is True
    flag = ("--engram-config.thp_packing", "thp_packing", "on")
    assert load_deployment({"engram": {"use_thp": False}}, env={}, overrides=[flag]).engram.use_thp is True
    # a later input in the new name wins over an earlier one in the old
    assert load_deployment({"engram": {"thp_packing": True}}, env={}, engram_json=['{"use_thp": false}']).engram == (
        EngramConfig()
    )


def test_both_names_in_one_object_is_a_problem() -> None:
    with pytest.raises(ConfigError) as raised:
        load_config({"thp_packing": True, "use_thp": True}, env={})
    assert raised.value.errors == [
        Problem("/engram/thp_packing", "older-name", "thp_packing is the older name of use_thp: give only use_thp")
    ]


def test_rules_speak_the_new_name() -> None:
    with pytest.raises(ConfigError) as raised:
        load_config({"thp_packing": True, "cpu_offload": False}, env={})
    assert raised.value.errors == [
        Problem(
            "/engram/use_thp",
            "use-thp-needs-private-offload",
            "use_thp requires cpu_offload=True and dp_shared_memory=False",
        )
    ]


def test_the_command_line(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["validate", "--engram-config.thp_packing", "true"]) == 0
    out = capsys.readouterr().out
    assert "use_thp=true" in out and "thp_packing" not in out
    assert main(["hash", "--engram-config", '{"thp_packing": true}']) == 0
    config = EngramConfig(use_thp=True)
    assert capsys.readouterr().out == f"{config.compute_hash()}  {config.digest_name()}\n"
    assert main(["hash", "--older-names", "--engram-config.dp_shared_memory", "true"]) == 0
    assert capsys.readouterr().out == (
        "a56ef8a6cf7201e40893a008895a4eaff3695e00dd240da34b9d1ef61a66f083"
        "  the seed's EngramConfig.compute_hash(), the fields under their first names\n"
    )
