"""tmpatch.env: parsing the TMPATCH* variables (pure functions, no process)."""
from __future__ import annotations

import pytest

from tmpatch import env
from tmpatch.patches import NAMES


@pytest.mark.parametrize("value", ["1", "true", "TRUE", " yes ", "on", "On"])
def test_switch_on(value):
    settings = env.read({"TMPATCH": value})
    assert settings.enabled and settings.problems == []


@pytest.mark.parametrize("value", ["0", "false", "no", "off", "", "  ", "OFF"])
def test_switch_off(value):
    settings = env.read({"TMPATCH": value})
    assert not settings.enabled and settings.problems == []


def test_switch_absent():
    settings = env.read({})
    assert not settings.enabled
    assert settings.options == {} and settings.log_level is None and settings.problems == []


def test_switch_unknown_value_stays_off_with_one_message():
    settings = env.read({"TMPATCH": "maybe"})
    assert not settings.enabled
    assert len(settings.problems) == 1
    message = settings.problems[0]
    assert "TMPATCH='maybe'" in message and "1, true, yes, on" in message


def test_companions_map_to_apply_keywords():
    settings = env.read({
        "TMPATCH": "1",
        "TMPATCH_PATCHES": "safe_divide, cumsum_device",
        "TMPATCH_EXCLUDE": "gather_autograd",
        "TMPATCH_STRICT": "yes",
        "TMPATCH_LOG_LEVEL": "INFO",
    }, valid_names=NAMES)
    assert settings.problems == []
    assert settings.options == {
        "patches": ("safe_divide", "cumsum_device"),
        "exclude": ("gather_autograd",),
        "strict": True,
    }
    assert settings.log_level == "info"


def test_empty_list_means_unset():
    settings = env.read({"TMPATCH": "1", "TMPATCH_PATCHES": " , ", "TMPATCH_EXCLUDE": ""})
    assert settings.options == {} and settings.problems == []


def test_unknown_patch_names_dropped_rest_kept_one_message_naming_valid_ones():
    settings = env.read({"TMPATCH": "1", "TMPATCH_PATCHES": "safe_divide,nope,also_nope"}, valid_names=NAMES)
    assert settings.enabled
    assert settings.options["patches"] == ("safe_divide",)
    assert len(settings.problems) == 1
    message = settings.problems[0]
    assert "TMPATCH_PATCHES" in message and "'nope'" in message and "'also_nope'" in message
    assert all(name in message for name in NAMES)


def test_names_are_not_checked_without_the_catalogue():
    settings = env.read({"TMPATCH": "1", "TMPATCH_EXCLUDE": "nope"})
    assert settings.options["exclude"] == ("nope",) and settings.problems == []
    assert len(settings.check_names(NAMES)) == 1
    assert settings.options["exclude"] == ()


@pytest.mark.parametrize("variable, value, fragment", [
    ("TMPATCH_STRICT", "sometimes", "1, true, yes, on"),
    ("TMPATCH_LOG_LEVEL", "loud", "debug, info, warning, error, critical"),
])
def test_bad_values_ignored_with_one_message_each(variable, value, fragment):
    settings = env.read({"TMPATCH": "1", variable: value, "TMPATCH_PATCHES": "safe_divide"}, valid_names=NAMES)
    assert settings.enabled and settings.options["patches"] == ("safe_divide",)
    assert len(settings.problems) == 1
    assert variable in settings.problems[0] and fragment in settings.problems[0]
    assert "strict" not in settings.options and settings.log_level is None


def test_misspelt_variables_reported_once_with_the_valid_ones():
    settings = env.read({"TMPATCH": "1", "TMPATCH_EXLUDE": "x", "TMPATCH_LOGLEVEL": "info",
                         "TMPATCH_TEST_RELEASE": "1.4.0", "TMPATCH_NAN_CHECK": "eager",
                         "TMPATCH_DDP_RELEASES": "all", "TMPATCH_COLOUR": "red"})
    assert settings.enabled
    assert len(settings.problems) == 1
    message = settings.problems[0]
    assert "TMPATCH_EXLUDE (did you mean TMPATCH_EXCLUDE?)" in message
    assert "TMPATCH_LOGLEVEL (did you mean TMPATCH_LOG_LEVEL?)" in message
    assert all(setting.variable in message for setting in env.SETTINGS)  # the valid ones are named
    for other in ("TMPATCH_TEST_RELEASE", "TMPATCH_NAN_CHECK", "TMPATCH_DDP_RELEASES", "TMPATCH_COLOUR"):
        assert other not in message  # other tools' variables pass silently


def test_values_are_never_evaluated(tmp_path):
    marker = tmp_path / "ran"
    code = f"__import__('pathlib').Path({str(marker)!r}).touch()"
    settings = env.read({"TMPATCH": code, "TMPATCH_PATCHES": code, "TMPATCH_LOG_LEVEL": code},
                        valid_names=NAMES)
    assert not marker.exists()
    assert not settings.enabled
    assert settings.options.get("patches") == () and settings.log_level is None


def test_to_environ_inverts_read():
    options = {"patches": ("safe_divide",), "exclude": ["cumsum_device", "gather_autograd"],
               "strict": True, "log_level": "debug"}
    variables = env.to_environ(options)
    assert variables == {"TMPATCH_PATCHES": "safe_divide", "TMPATCH_EXCLUDE": "cumsum_device,gather_autograd",
                         "TMPATCH_STRICT": "1", "TMPATCH_LOG_LEVEL": "debug"}
    settings = env.read(dict(variables, TMPATCH="1"), valid_names=NAMES)
    assert settings.options == {"patches": ("safe_divide",), "exclude": ("cumsum_device", "gather_autograd"),
                                "strict": True}
    assert settings.log_level == "debug"


def test_one_line_per_setting_every_api_setting_is_an_apply_keyword():
    import inspect

    import tmpatch

    keywords = inspect.signature(tmpatch.apply).parameters
    for setting in env.SETTINGS:
        assert setting.variable.startswith("TMPATCH_") and setting.doc
        assert not setting.api or setting.option in keywords
