"""The plugin's environment variables: accepted values and clear errors."""

from __future__ import annotations

import pytest

from vllm_rocm_asm_decode import settings
from vllm_rocm_asm_decode.eligibility import default_cut, resolve_cut


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        (None, True),
        ("1", True),
        ("true", True),
        ("TRUE", True),
        ("0", False),
        ("false", False),
        ("False", False),
    ],
    ids=lambda v: repr(v),
)
def test_switch_values(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv(settings.SWITCH_ENV, raising=False)
    else:
        monkeypatch.setenv(settings.SWITCH_ENV, raw)
    assert settings.asm_decode_switch() is expected


@pytest.mark.parametrize("raw", ["2", "maybe", "enabled", "-1", "", " 1", "yes", "off"])
def test_switch_bad_value_names_variable_and_value(monkeypatch, raw):
    monkeypatch.setenv(settings.SWITCH_ENV, raw)
    with pytest.raises(settings.SettingError) as err:
        settings.asm_decode_switch()
    assert settings.SWITCH_ENV in str(err.value) and repr(raw) in str(err.value)


@pytest.mark.parametrize(
    ("name", "parse"),
    [(settings.SWITCH_ENV, settings.asm_decode_switch), (settings.TRUST_ENV, settings.trust_aiter)],
    ids=["switch", "trust-aiter"],
)
def test_a_bad_flag_lists_every_value_it_takes(monkeypatch, name, parse):
    """(trial 17) true and false are taken as 1 and 0 are: the error lists them too."""
    monkeypatch.setenv(name, "yes")
    with pytest.raises(settings.SettingError) as err:
        parse()
    assert "use 1 or true (" in str(err.value) and "or 0 or false (" in str(err.value), err


@pytest.mark.parametrize(("raw", "expected"), [(None, None), ("640", 640), ("0512", 512)])
def test_cut_values(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv(settings.CUT_ENV, raising=False)
    else:
        monkeypatch.setenv(settings.CUT_ENV, raw)
    assert settings.cut_override() == expected


@pytest.mark.parametrize(
    "raw",
    [
        "0",
        "-512",
        "+512",
        "512.5",
        "lots",
        "2e3",
        "",
        " 512 ",
        "512\n",
        "5_12",
        "\u0665\u0661\u0662",
        "9" * 13,
    ],
    ids=lambda v: repr(v),
)
def test_cut_bad_value_names_variable_and_value(monkeypatch, raw):
    monkeypatch.setenv(settings.CUT_ENV, raw)
    with pytest.raises(settings.SettingError) as err:
        settings.cut_override()
    assert settings.CUT_ENV in str(err.value) and repr(raw) in str(err.value)


@pytest.mark.parametrize(("cus", "cut"), [(256, 512), (304, 608)], ids=["mi355x", "mi300x"])
def test_default_cut_is_two_query_heads_per_compute_unit(monkeypatch, cus, cut):
    monkeypatch.delenv(settings.CUT_ENV, raising=False)
    assert default_cut(cus) == cut
    assert resolve_cut(cus, settings.cut_override()) == cut
    monkeypatch.setenv(settings.CUT_ENV, "1000")
    assert resolve_cut(cus, settings.cut_override()) == 1000


@pytest.mark.parametrize(
    ("raw", "expected"),
    [(None, False), ("1", True), ("True", True), ("0", False), ("FALSE", False)],
    ids=lambda v: repr(v),
)
def test_trust_aiter_values(monkeypatch, raw, expected):
    if raw is None:
        monkeypatch.delenv(settings.TRUST_ENV, raising=False)
    else:
        monkeypatch.setenv(settings.TRUST_ENV, raw)
    assert settings.trust_aiter() is expected


@pytest.mark.parametrize("raw", ["2", "always", "0.1.17", "", "yes"])
def test_trust_aiter_bad_value_names_variable_and_value(monkeypatch, raw):
    monkeypatch.setenv(settings.TRUST_ENV, raw)
    for check in (settings.trust_aiter, settings.check_all):
        with pytest.raises(settings.SettingError) as err:
            check()
        assert settings.TRUST_ENV in str(err.value) and repr(raw) in str(err.value)


@pytest.mark.parametrize(
    ("command", "env"),
    [
        (["check", "accuracy"], {"VLLM_ROCM_ASM_DECODE": "maybe"}),
        (["bench", "kernel"], {"VLLM_ROCM_ASM_DECODE": " 1 "}),
        (["check", "accuracy"], {"VLLM_ROCM_ASM_DECODE_CUT": " 512 "}),
        (["plan"], {"VLLM_ROCM_ASM_DECODE_CUT": "\u0665\u0661\u0662"}),
    ],
    ids=["accuracy-switch", "kernel-switch", "accuracy-cut", "plan-cut"],
)
def test_every_command_refuses_a_bad_setting_alike(command, env, monkeypatch, capsys):
    """The same values are refused by plan, check accuracy and bench kernel (and by
    register(), tests/e2e/test_plugin.py), in one line naming the variable."""
    from vllm_rocm_asm_decode.tools.cli import main

    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert main(command) == 2
    (line,) = capsys.readouterr().err.strip().splitlines()
    ((name, value),) = env.items()
    assert f"{name}={value!r}" in line


def test_a_cut_of_thousands_of_digits_is_refused_not_parsed(monkeypatch):
    monkeypatch.setenv(settings.CUT_ENV, "9" * 5000)
    with pytest.raises(settings.SettingError) as err:
        settings.cut_override()
    assert f"{settings.CUT_ENV}='{'9' * 40}...' is not a positive" in str(err.value)


@pytest.mark.parametrize(
    ("raw", "shown"),
    [
        ("False", "VLLM_ROCM_ASM_DECODE=False"),
        ("FALSE", "VLLM_ROCM_ASM_DECODE=FALSE"),
        ("0", "VLLM_ROCM_ASM_DECODE=0"),
        (None, "VLLM_ROCM_ASM_DECODE=(unset)"),
    ],
    ids=["False", "FALSE", "0", "unset"],
)
def test_the_switch_is_reported_as_written(monkeypatch, raw, shown):
    if raw is None:
        monkeypatch.delenv(settings.SWITCH_ENV, raising=False)
    else:
        monkeypatch.setenv(settings.SWITCH_ENV, raw)
    assert settings.switch_as_written() == shown
