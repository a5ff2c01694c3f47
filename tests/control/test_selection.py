"""tmpatch.control.selection: patch names and apply()/revert() arguments, checked
before anything changes, with a clear message for each mistake."""
from __future__ import annotations

import re

import pytest
import torchmetrics  # noqa: F401,E402  (apply() works on the imported release)

import tmpatch
from tmpatch.control import selection
from tmpatch.patches import NAMES
from tmpatch.runtime import policies

pytestmark = pytest.mark.once  # nothing here depends on the torchmetrics release


@pytest.fixture(autouse=True)
def _policies():
    saved = dict(policies.current)
    yield
    policies.current.update(saved)


@pytest.mark.parametrize("value, expected", [
    (None, None),
    ("safe_divide", ("safe_divide",)),
    ("safe_divide, nan_check", ("safe_divide", "nan_check")),
    (["nan_check", "safe_divide", "nan_check"], ("nan_check", "safe_divide")),
    ((name for name in ["bincount"]), ("bincount",)),
    ([], ()),
    ({"cumsum_device"}, ("cumsum_device",)),
])
def test_names_accepts_a_name_a_list_or_any_iterable(value, expected):
    assert selection.names(value, "patches") == expected


@pytest.mark.parametrize("value, error, message", [
    (42, TypeError, "patches must be a patch name (str), a list of names or None; got int 42"),
    (b"safe_divide", TypeError, "got bytes b'safe_divide' (bytes: decode it first)"),
    (bytearray(b"x"), TypeError, "got bytearray"),
    (["safe_divide", 3], TypeError, "patches must hold patch names (str); got int 3"),
    ([b"safe_divide"], TypeError, "got bytes b'safe_divide'"),
    ("", ValueError, "patches: '' names no patch"),
    (" , ", ValueError, "names no patch"),
    (["safe_divid"], ValueError, "patches: unknown patch name(s) 'safe_divid' (did you mean 'safe_divide'?); "
                                 "valid names: " + ", ".join(NAMES)),
    ("nope", ValueError, "unknown patch name(s) 'nope'; valid names"),
])
def test_names_rejects_with_a_clear_message(value, error, message):
    with pytest.raises(error) as caught:
        selection.names(value, "patches")
    assert message in str(caught.value)
    assert "115" not in str(caught.value)  # not the bytes' items


def test_select_keeps_the_catalogue_order():
    selected, left_out = selection.select(["gather_autograd", "safe_divide"], "gather_autograd")
    assert selected == ["safe_divide"] and left_out == [n for n in NAMES if n != "safe_divide"]
    assert selection.select(None, None) == (list(NAMES), [])


def test_select_takes_what_the_required_patches_require():
    """panoptic_matching requires panoptic_preprocess, which requires deferred_reports: all three are
    selected, unless one is excluded (then what only it requires is not taken either)."""
    selected, _ = selection.select(["panoptic_matching"], None)
    assert selected == [n for n in NAMES if n in ("deferred_reports", "panoptic_preprocess", "panoptic_matching")]
    selected, _ = selection.select(["panoptic_matching"], ["panoptic_preprocess"])
    assert selected == ["panoptic_matching"]


@pytest.mark.parametrize("kwargs, error, message", [
    ({"patches": 42}, TypeError, "tmpatch.apply(patches=...) must be a patch name (str), a list of names or None; "
                                 "got int 42"),
    ({"patches": b"safe_divide"}, TypeError, "got bytes b'safe_divide'"),
    ({"exclude": ["nope"]}, ValueError, "tmpatch.apply(exclude=...): unknown patch name(s) 'nope'"),
    ({"patches": ["nope"], "nan_check": "eager"}, ValueError, "tmpatch.apply(patches=...): unknown patch name"),
    ({"patches": ["safe_divide"], "nan_check": "later"}, ValueError, "nan_check must be one of deferred, eager, off"),
    ({"bincount": "off", "nan_check": "eager"}, ValueError, "bincount must be one of deferred, eager; got 'off'"),
    ({"nan_check": 0}, TypeError, "nan_check must be a string"),
    ({"strict": "yes", "nan_check": "eager"}, ValueError, "tmpatch.apply(strict=...): unknown patch name(s) 'yes'"),
    ({"strict": 1}, TypeError, "tmpatch.apply(strict=...) must be True, False or patch names; got int 1"),
    ({"strict": None}, TypeError, "tmpatch.apply(strict=...) must be True, False or patch names; got NoneType"),
    ({"patches": ["safe_divide"], "strict": ["safe_divide", "image_constants"]}, ValueError,
     "tmpatch.apply(strict=...) names image_constants, not among the patches applied (safe_divide)"),
    ({"nan_chek": "eager"}, TypeError, "unexpected keyword argument 'nan_chek' (did you mean nan_check?)"),
])
def test_apply_checks_every_argument_before_changing_anything(kwargs, error, message):
    before = (tmpatch.status(), dict(policies.current))
    with pytest.raises(error) as caught:
        tmpatch.apply(**kwargs)
    assert message in str(caught.value)
    assert (tmpatch.status(), dict(policies.current)) == before  # no policy set, no patch applied


def test_apply_with_good_arguments_sets_the_policies():
    tmpatch.apply(["nan_check"], nan_check="eager", bincount=None)
    assert policies.current["nan_check"] == "eager" and policies.current["bincount"] == "deferred"


def test_revert_checks_its_argument():
    with pytest.raises(TypeError, match=re.escape("tmpatch.revert(patches=...) must be")):
        tmpatch.revert(42)
    with pytest.raises(ValueError, match="did you mean 'nan_check'"):
        tmpatch.revert("nancheck")


def test_a_second_revert_still_says_reverted():
    tmpatch.apply(["mean_default_weight"])
    assert tmpatch.revert()["mean_default_weight"].state == "reverted"
    report = tmpatch.revert()
    assert report["mean_default_weight"].state == "reverted"
    assert tmpatch.revert(["mean_default_weight"])["mean_default_weight"].state == "reverted"
    assert report["safe_divide"].state in ("off", "reverted")
