"""tmpatch.control.env: parsing the TMPATCH* variables (pure functions, no process)."""
from __future__ import annotations

import pytest

from tmpatch.control import env
from tmpatch.patches import NAMES

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release


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
    assert "TMPATCH='maybe'" in message and "1, true, yes, on" in message and message.variable == "TMPATCH"


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


@pytest.mark.parametrize("value", ["", " , ", ",,"])
def test_a_patches_list_naming_nothing_applies_nothing_with_one_warning(value):
    """``TMPATCH_PATCHES=,,`` is a selection of none (as ``=nope`` and
    ``apply(patches=[])``), never "all"; the warning names the valid form."""
    settings = env.read({"TMPATCH": "1", "TMPATCH_PATCHES": value}, valid_names=NAMES)
    assert settings.options == {"patches": ()}
    assert len(settings.problems) == 1
    message = settings.problems[0]
    assert f"TMPATCH_PATCHES={value!r} names no patch" in message
    assert "comma-separated patch names" in message and "no patch is applied" in message


@pytest.mark.parametrize("variable, value, fragment", [
    ("TMPATCH_EXCLUDE", "", "comma-separated patch names"),
    ("TMPATCH_EXCLUDE", ",", "comma-separated patch names"),
    ("TMPATCH_STRICT", "", "1/true/yes/on, 0/false/no/off or comma-separated patch names"),
    ("TMPATCH_LOG_LEVEL", "  ", "one of debug, info, warning, error, critical"),
    ("TMPATCH_NAN_CHECK", "", "one of deferred, eager, off"),
    ("TMPATCH_BINCOUNT", "", "one of deferred, eager"),
])
def test_empty_values_are_one_warning_naming_the_valid_form(variable, value, fragment):
    settings = env.read({"TMPATCH": "1", variable: value})
    assert settings.options == {} and settings.policies == {} and settings.log_level is None
    assert len(settings.problems) == 1
    assert settings.problems[0].startswith(f"{variable}={value!r} ") and fragment in settings.problems[0]
    assert settings.problems[0].variable == variable


def test_unknown_patch_names_dropped_rest_kept_one_message_naming_valid_ones():
    settings = env.read({"TMPATCH": "1", "TMPATCH_PATCHES": "safe_divide,nope,also_nope"}, valid_names=NAMES)
    assert settings.enabled
    assert settings.options["patches"] == ("safe_divide",)
    assert len(settings.problems) == 1
    message = settings.problems[0]
    assert "TMPATCH_PATCHES" in message and "'nope'" in message and "'also_nope'" in message
    assert all(name in message for name in NAMES)


def test_strict_takes_patch_names_checked_as_the_others():
    settings = env.read({"TMPATCH": "1", "TMPATCH_STRICT": "image_constants, nope"}, valid_names=NAMES)
    assert settings.options["strict"] == ("image_constants",)
    assert len(settings.problems) == 1 and "TMPATCH_STRICT: unknown patch name(s) 'nope'" in settings.problems[0]
    assert "using image_constants" in settings.problems[0]


def test_names_are_not_checked_without_the_catalogue():
    settings = env.read({"TMPATCH": "1", "TMPATCH_EXCLUDE": "nope"})
    assert settings.options["exclude"] == ("nope",) and settings.problems == []
    assert len(settings.check_names(NAMES)) == 1
    assert settings.options["exclude"] == ()


@pytest.mark.parametrize("variable, value, fragment", [
    ("TMPATCH_STRICT", "sometimes", "unknown patch name(s) 'sometimes' ignored (strict about no patch)"),
    ("TMPATCH_LOG_LEVEL", "loud", "one of debug, info, warning, error, critical"),
    ("TMPATCH_NAN_CHECK", "later", "one of deferred, eager, off"),
    ("TMPATCH_BINCOUNT", "off", "one of deferred, eager"),
])
def test_bad_values_ignored_with_one_message_each(variable, value, fragment):
    settings = env.read({"TMPATCH": "1", variable: value, "TMPATCH_PATCHES": "safe_divide"}, valid_names=NAMES)
    assert settings.enabled and settings.options["patches"] == ("safe_divide",)
    assert len(settings.problems) == 1
    assert variable in settings.problems[0] and fragment in settings.problems[0]
    assert "strict" not in settings.options and settings.log_level is None and settings.policies == {}


def test_policies_are_read_case_insensitively():
    settings = env.read({"TMPATCH_NAN_CHECK": " EAGER ", "TMPATCH_BINCOUNT": "eager"})
    assert settings.policies == {"nan_check": "eager", "bincount": "eager"} and settings.problems == []
    assert settings.options == {}  # tmpatch.control.settings reads them itself; apply() does not get them


def test_misspelt_variables_one_warning_each_naming_the_closest():
    settings = env.read({"TMPATCH": "1", "TMPATCH_EXLUDE": "x", "TMPATCH_LOGLEVEL": "info",
                         "TMPATCH_NANCHECK": "off", "TMPATCH_bincount": "eager", "TMPATCH_PATCH": "safe_divide",
                         "TMPATCH_TEST_RELEASE": "1.4.0", "TMPATCH_NAN_CHECK": "eager",
                         "TMPATCH_DDP_RELEASES": "all", "TMPATCH_COLOUR": "red"})
    assert settings.enabled
    found = {problem.split()[0]: problem for problem in settings.problems}
    assert set(found) == {"TMPATCH_EXLUDE", "TMPATCH_LOGLEVEL", "TMPATCH_NANCHECK", "TMPATCH_bincount",
                          "TMPATCH_PATCH"}, settings.problems
    for wrong, right in [("TMPATCH_EXLUDE", "TMPATCH_EXCLUDE"), ("TMPATCH_LOGLEVEL", "TMPATCH_LOG_LEVEL"),
                         ("TMPATCH_NANCHECK", "TMPATCH_NAN_CHECK"), ("TMPATCH_bincount", "TMPATCH_BINCOUNT"),
                         ("TMPATCH_PATCH", "TMPATCH_PATCHES")]:
        assert f"did you mean {right}?" in found[wrong] and found[wrong].variable == right
        assert all(setting.variable in found[wrong] for setting in env.SETTINGS)  # the valid ones are named
    assert settings.policies == {"nan_check": "eager"}


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
               "strict": True, "log_level": "debug", "nan_check": "off", "bincount": None}
    variables = env.to_environ(options)
    assert variables == {"TMPATCH_PATCHES": "safe_divide", "TMPATCH_EXCLUDE": "cumsum_device,gather_autograd",
                         "TMPATCH_STRICT": "1", "TMPATCH_LOG_LEVEL": "debug", "TMPATCH_NAN_CHECK": "off"}
    settings = env.read(dict(variables, TMPATCH="1"), valid_names=NAMES)
    assert settings.options == {"patches": ("safe_divide",), "exclude": ("cumsum_device", "gather_autograd"),
                                "strict": True}
    assert settings.log_level == "debug" and settings.policies == {"nan_check": "off"}
    assert settings.problems == []
