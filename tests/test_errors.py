"""One error family: every error a user can cause derives from EngramError, which the package exports,
and the command line catches that one type, printing one line per problem and exiting 2."""

from __future__ import annotations

import pytest

import engram
from codegen.load import SchemaError
from engram.cli import main
from engram.errors import ConfigError, EngramError, Problem
from engram.validation.ecma import EcmaSyntaxError, translate
from engram.validation.patterns import PatternTimeout


def test_every_user_error_is_an_engram_error() -> None:
    for error in (ConfigError, SchemaError, EcmaSyntaxError, PatternTimeout):
        assert issubclass(error, EngramError), error
    assert issubclass(ConfigError, ValueError) and issubclass(EcmaSyntaxError, ValueError)
    assert engram.EngramError is EngramError and engram.ConfigError is ConfigError
    with pytest.raises(EngramError, match="not an ECMA-262 pattern"):
        translate("a{2,1}")
    problems = ConfigError([Problem("/engram/x", "rule-a", "first"), Problem("", "rule-b", "second")])
    assert problems.lines() == ["/engram/x: first [rule-a]", "/: second [rule-b]"]
    assert EngramError("set file_backed to false").lines() == ["set file_backed to false"]


def test_the_command_line_prints_each_problem_on_a_line(capsys: pytest.CaptureFixture[str]) -> None:
    document = '{"use_thp": true, "cpu_offload": false, "unknown": 1}'
    assert main(["validate", "--engram-config", document]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all(line.startswith("error: /engram") for line in lines), lines
    assert main(["make-checkpoint", "--preset", "tiny", "--out", "/proc/engram-nowhere"]) == 2
    assert capsys.readouterr().err.count("\n") == 1
