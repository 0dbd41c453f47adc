"""Options: arguments > NANOPATCH_* environment > auto-detection, and clear errors for bad values."""

from __future__ import annotations

import pytest

from nanopatch.engine import config


def test_auto_detection_on_a_cpu_with_native_bf16(machine):
    cfg = config.resolve()
    assert cfg.bf16 is True and cfg.sources["bf16"] == "auto"
    assert "amx_bf16" in cfg.reasons["bf16"]
    assert cfg.channels_last is True and cfg.sources["channels_last"] == "auto"
    assert cfg.vision is True and cfg.training is True and cfg.compile is False
    assert cfg.sources["vision"] == "default"
    assert cfg.ipex is False and cfg.reasons["ipex"] == "intel-extension-for-pytorch is not installed"


def test_auto_detection_on_a_cpu_without_native_bf16(machine, fresh_log_once, caplog):
    machine("xeon_skylake_4c.cpuinfo")
    caplog.set_level("INFO", logger="nanopatch")
    cfg = config.resolve()
    config.resolve()
    assert cfg.bf16 is False and cfg.sources["bf16"] == "auto"
    assert "no native bf16" in cfg.reasons["bf16"]
    said = [r.getMessage() for r in caplog.records if "bf16 autocast stays off" in r.getMessage()]
    assert len(said) == 1  # once per process, not per call


def test_channels_last_auto_is_off_without_avx2(machine):
    machine("arm64_graviton.cpuinfo")
    cfg = config.resolve()
    assert cfg.channels_last is False and "no AVX2" in cfg.reasons["channels_last"]


@pytest.mark.parametrize(
    ("ipex", "torch", "expected", "reason"),
    [
        ("2.8.0", "2.8.0", True, "matches torch 2.8.0"),
        ("2.8.0+cpu", "2.8.1+cu128", True, "matches"),
        ("2.8.0", "2.13.0", False, "needs torch 2.8.*, but torch 2.13.0 is installed"),
        (None, "2.13.0", False, "not installed"),
        ("2.8.0", None, False, "torch is not"),
    ],
)
def test_ipex_compatibility_from_metadata(machine, ipex, torch, expected, reason):
    machine("xeon_spr_2s_ht.cpuinfo", ipex=ipex, torch=torch)
    cfg = config.resolve()
    assert cfg.ipex is expected and reason in cfg.reasons["ipex"]


@pytest.mark.parametrize(
    ("flags", "can"),
    [
        ({"avx2", "fma"}, False),  # an AMD EPYC with AVX2 alone
        ({"avx2", "avx512f", "avx512bw", "avx512vl"}, False),
        ({"avx2", "avx512f", "avx512bw", "avx512vl", "avx512dq"}, True),  # Skylake-SP and later
        ({"avx2", "avx_ne_convert"}, True),
        (set(), True),  # no cpuinfo: IPEX's own check decides
    ],
)
def test_ipex_bf16_needs_the_instructions_of_its_weight_prepack(flags, can):
    from nanopatch.targets.training import ipex

    why = ipex.bf16_cpu_why_not(frozenset(flags))
    assert (why is None) is can
    if not can:
        assert "avx512bw, avx512vl and avx512dq or avx_ne_convert" in why


@pytest.mark.parametrize(
    ("transformers", "expected"), [(None, True), ("4.57.6", True), ("5.0.0", False), ("5.24.0", False)]
)
def test_ipex_2_8_is_not_imported_next_to_transformers_5(machine, monkeypatch, transformers, expected):
    """IPEX 2.8's import dies halfway under transformers 5 (after registering its operators):
    the metadata says so before anything is imported."""
    versions = {"intel-extension-for-pytorch": "2.8.0", "torch": "2.8.0", "transformers": transformers}
    monkeypatch.setattr(config, "distribution_version", versions.get)
    cfg = config.resolve()
    assert cfg.ipex is expected
    if not expected:
        assert (
            f"cannot be imported next to transformers {transformers} (it needs transformers < 5)" in cfg.reasons["ipex"]
        )


def test_precedence_argument_over_environment_over_auto(machine, monkeypatch):
    monkeypatch.setenv("NANOPATCH_BF16", "0")
    monkeypatch.setenv("NANOPATCH_VISION", "off")
    monkeypatch.setenv("NANOPATCH_COMPILE", "max-autotune")
    cfg = config.resolve()
    assert (cfg.bf16, cfg.sources["bf16"], cfg.reasons["bf16"]) == (False, "environment", "set by NANOPATCH_BF16=0")
    assert cfg.vision is False and cfg.compile == "max-autotune"
    cfg = config.resolve({"bf16": True, "vision": True, "compile": False})
    assert cfg.bf16 is True and cfg.sources["bf16"] == "argument"
    assert cfg.vision is True and cfg.compile is False and cfg.sources["compile"] == "argument"
    # None as an argument means "not given": the environment still applies
    assert config.resolve({"bf16": None}).sources["bf16"] == "environment"


@pytest.mark.parametrize("raw", ["auto", "AUTO", "", "  "])
def test_auto_or_empty_environment_means_auto(machine, monkeypatch, raw):
    monkeypatch.setenv("NANOPATCH_BF16", raw)
    assert config.resolve().sources["bf16"] == "auto"


@pytest.mark.parametrize(
    ("raw", "expected"),
    [("1", True), ("true", True), ("Yes", True), ("ON", True), ("0", False), ("false", False), ("no", False)],
)
def test_boolean_spellings(machine, monkeypatch, raw, expected):
    monkeypatch.setenv("NANOPATCH_CHANNELS_LAST", raw)
    assert config.resolve().channels_last is expected


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        (True, "default"),
        ("1", "default"),
        ("reduce-overhead", "reduce-overhead"),
        (False, False),
        ("off", False),
        ("auto", "auto"),
        ("AUTO", "auto"),
    ],
)
def test_compile_values(machine, value, expected):
    assert config.resolve({"compile": value}).compile == expected


@pytest.mark.parametrize(
    ("options", "env", "message"),
    [
        ({}, {"NANOPATCH_BF16": "maybe"}, "'bf16' (from NANOPATCH_BF16): 'maybe' is not allowed; use true/false"),
        (
            {"compile": "fastest"},
            {},
            "'compile': 'fastest' is not allowed; use false, true, auto (compile where it measures faster), "
            "or a torch.compile mode",
        ),
        ({}, {"NANOPATCH_COMPILE": "fastest"}, "max-autotune"),
        ({"vision": "auto"}, {}, "'vision': 'auto' is not allowed"),
        ({}, {"NANOPATCH_TRAINING": "auto"}, "'training' (from NANOPATCH_TRAINING)"),
        ({"bf16": 1}, {}, "'bf16': 1 is not allowed"),
        ({"ipex": "sometimes"}, {}, "'ipex'"),
    ],
)
def test_bad_values_name_the_option_and_the_allowed_values(machine, monkeypatch, options, env, message):
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    with pytest.raises(ValueError) as excinfo:
        config.resolve(options)
    assert message in str(excinfo.value)


def test_unknown_option_is_a_type_error(machine):
    with pytest.raises(TypeError, match=r"unknown nanopatch option.*bf61"):
        config.resolve({"bf61": True})


def test_explicit_environ_exports_only_explicit_choices(machine, monkeypatch):
    monkeypatch.setenv("NANOPATCH_VISION", "0")
    cfg = config.resolve({"bf16": False, "compile": "max-autotune"})
    assert cfg.explicit_environ() == {
        "NANOPATCH_VISION": "0",
        "NANOPATCH_BF16": "0",
        "NANOPATCH_COMPILE": "max-autotune",
    }


def test_config_equality_ignores_sources(machine, monkeypatch):
    by_arg = config.resolve({"bf16": True})
    monkeypatch.setenv("NANOPATCH_BF16", "1")
    assert config.resolve() == by_arg  # same values: patching again is a no-op
    assert config.resolve({"bf16": False}) != by_arg


def test_explicit_ipex_that_cannot_work_is_turned_off_with_a_warning(machine, fresh_log_once):
    from nanopatch import NanopatchWarning

    machine("xeon_spr_2s_ht.cpuinfo", ipex="2.8.0", torch="2.13.0")
    with pytest.warns(NanopatchWarning, match=r"ipex was requested, but .*needs torch 2\.8\.\*"):
        cfg = config.resolve({"ipex": True})
    assert cfg.ipex is False and cfg.sources["ipex"] == "argument"
    assert cfg.reasons["ipex"].endswith("IPEX stays off")
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        config.resolve({"ipex": True})  # said once per process, not per call


def test_explicit_bf16_without_native_support_is_kept_with_a_warning(machine, fresh_log_once, monkeypatch):
    from nanopatch import NanopatchWarning

    machine("laptop_avx2.cpuinfo")
    monkeypatch.setenv("NANOPATCH_BF16", "1")
    with pytest.warns(NanopatchWarning, match="bf16 was requested, but CPU has no native bf16"):
        cfg = config.resolve()
    assert cfg.bf16 is True and "although" in cfg.reasons["bf16"]


def test_every_option_is_defined_once_in_the_table():
    """config.TABLE is the one definition: Config's fields are its names in its order, each
    option has a default of its kind or a detector (tristate: a detector), and patch_torch's
    docstring and the runner's --help are built from it."""
    import dataclasses

    import nanopatch
    from nanopatch.runner import cli

    fields = [f.name for f in dataclasses.fields(config.Config) if f.name not in ("sources", "reasons")]
    assert fields == [option.name for option in config.TABLE] == list(config.OPTIONS)
    assert len(config.BY_NAME) == len(config.TABLE)
    helps = cli.build_parser().format_help()
    for option in config.TABLE:
        assert option.kind in config.KINDS_MARKDOWN
        if option.kind == "tristate":
            assert option.detect is not None, option.name
        elif option.detect is None:
            assert config.parse_value(option.name, option.default) == option.default, option.name
        assert f"    {option.name} ({option.default_word}): {option.help}" in nanopatch.patch_torch.__doc__
        assert (option.env in helps) is option.flag, option.name
        assert (option.flag_name in helps) is option.flag, option.name
