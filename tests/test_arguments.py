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


def test_one_list_parser_for_every_list_option():
    assert numbers("--budgets", " 5, ,10,", 0, integral=True, blanks=True) == (5, 10)  # blank items left out
    assert numbers("--budgets", "", 0, integral=True, blanks=True) == ()
    assert numbers("--ports", "1,2,3,4", 0, integral=True, count=4, digits=True) == (1, 2, 3, 4)
    for call, message in [
        (lambda: numbers("--ports", "1,2", 0, count=4, form="four ports"), "--ports '1,2': give four ports"),
        (lambda: numbers("--budgets", "1e6", 0, integral=True, digits=True, form="token counts"),
         "--budgets '1e6': give token counts"),
        (lambda: numbers("--budgets", "3.0", 0, integral=True, digits=True), "--budgets '3.0': give comma-separated numbers"),
        (lambda: numbers("--budgets", "5,-1", 0, integral=True, blanks=True, digits=True), "--budgets '-1': must be >= 0"),
        (lambda: numbers("--b", "", blanks=False), "--b '': give comma-separated numbers"),
    ]:
        with pytest.raises(ConfigError) as exc:
            call()
        assert str(exc.value) == message


def test_an_option_declared_once_adds_to_any_parser():
    import argparse

    import configargparse  # what Locust's parser is (importing locust here would monkey-patch the test process)

    from hstu_replay.arguments import CANDIDATES, MAX_HISTORY, REPLAY_SEED, SMALL_MAX_HISTORY, Option

    plain = argparse.ArgumentParser()
    CANDIDATES.add_to(plain)
    SMALL_MAX_HISTORY.add_to(plain)
    REPLAY_SEED.add_to(plain)
    Option("--json", "as JSON", type=bool).add_to(plain)
    Option("store", "a store").add_to(plain)
    assert vars(plain.parse_args(["s"])) == {"candidates": 16, "max_history": 256, "seed": 0, "json": False,
                                             "store": "s"}
    assert plain.parse_args(["s", "--candidates", "3", "--replay-seed", "7", "--json"]).candidates == 3
    shown = " ".join(plain.format_help().split())
    assert "(default 16)" in shown and "(default 256: the small model's limit)" in shown

    text = argparse.ArgumentParser()  # a command that checks the text itself, one line per refusal
    MAX_HISTORY.add_to(text, text=True)
    CANDIDATES.add_to(text, default=None, text=True)
    assert vars(text.parse_args([])) == {"max_history": "4096", "candidates": None}

    locust = configargparse.ArgumentParser()
    group = locust.add_argument_group("hstu-replay")  # an argument group takes no include_in_web_ui: set on the action
    action = CANDIDATES.add_to(group, include_in_web_ui=False, env_var="LOCUST_CANDIDATES")
    secret = Option("--token", "a secret", "").add_to(locust, include_in_web_ui=True, is_secret=True)
    assert (action.include_in_web_ui, secret.include_in_web_ui, secret.is_secret) == (False, True, True)
    assert locust.parse_args([], env_vars={"LOCUST_CANDIDATES": "5"}).candidates == 5
