"""`finishline.read_number`, the one reader of a typed number: what it accepts, and why it refuses."""

from __future__ import annotations

import pytest

from finishline import NumberRefused, read_number


@pytest.mark.parametrize(
    ("text", "kwargs", "expected"),
    [
        ("3", {"whole": True}, 3),
        ("0", {"whole": True, "at_least": 0}, 0),
        ("2.5", {}, 2.5),
        ("0", {"at_least": 0}, 0.0),
        ("0.001", {"above": 0}, 0.001),
        (" 7 ", {"whole": True}, 7),
    ],
)
def test_a_number_in_range_is_read(text: str, kwargs: dict, expected: float) -> None:
    value = read_number(text, **kwargs)
    assert value == expected
    assert type(value) is type(expected)


@pytest.mark.parametrize(
    ("text", "kwargs"),
    [
        ("seven", {"whole": True}),
        ("2.5", {"whole": True}),
        ("", {}),
        ("soon", {}),
        ("inf", {}),
        ("nan", {"above": 0}),
        ("-inf", {"at_least": 0}),
    ],
)
def test_a_text_that_is_no_number_of_the_kind_is_refused_without_a_value(text: str, kwargs: dict) -> None:
    with pytest.raises(NumberRefused) as refused:
        read_number(text, **kwargs)
    assert refused.value.value is None
    assert refused.value.text == text


@pytest.mark.parametrize(
    ("text", "kwargs", "value"),
    [
        ("-3", {"whole": True, "at_least": 0}, -3),
        ("0", {"whole": True, "at_least": 1}, 0),
        ("0", {"above": 0}, 0.0),
        ("-0.5", {"at_least": 0}, -0.5),
    ],
)
def test_a_number_out_of_range_is_refused_with_its_value(text: str, kwargs: dict, value: float) -> None:
    with pytest.raises(NumberRefused) as refused:
        read_number(text, **kwargs)
    assert refused.value.value == value
