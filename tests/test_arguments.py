"""Numbers from command-line text: accepted values and the one line each refusal gives."""

import pytest

from hstu_replay.arguments import number, numbers
from hstu_replay.errors import ConfigError


def test_accepted_values():
    assert number("--n", "3", 1, integral=True) == 3 and isinstance(number("--n", "3.0", integral=True), int)
    assert number("--x", "0.5", 0, 1) == 0.5
    assert numbers("--b", "1, 2,8", 1, 8, integral=True) == (1, 2, 8)


@pytest.mark.parametrize("call, message", [
    (lambda: number("--x", "soon"), "--x 'soon': expected a number"),
    (lambda: number("--x", None), "--x None: expected a number"),
    (lambda: number("--x", "inf"), "--x 'inf': expected a finite number"),
    (lambda: number("--n", "1.5", integral=True), "--n '1.5': expected a finite whole number"),
    (lambda: number("--x", "0", 0, above=True), "--x '0': must be > 0"),
    (lambda: number("--x", "-1", 0), "--x '-1': must be >= 0"),
    (lambda: number("--b", "9", 1, 8), "--b '9': must be <= 8"),
    (lambda: numbers("--b", "1,,2"), "--b '1,,2': give comma-separated numbers"),
])
def test_refusals_name_option_value_and_rule(call, message):
    with pytest.raises(ConfigError) as exc:
        call()
    assert str(exc.value) == message
