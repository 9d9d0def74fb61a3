"""How figures read, and the terminal's tables."""

from hstu_replay.output.text import NO_VALUE, cell, fmt, format_table


def test_format_table_aligns_right():
    text = format_table([["a", "bbb"], ["1000", "2"]])
    assert text.splitlines() == ["   a  bbb", "----  ---", "1000    2"]
    assert format_table([]) == ""


def test_a_null_figure_reads_as_no_value():
    assert fmt(None, ".2f") == cell(None) == NO_VALUE == "-"
    assert fmt(2.5, ".2f", "x") == "2.50x" and cell(0.012345) == "0.0123" and cell(12.345, 1) == "12.3"
    assert cell({"b": 1, "a": [2]}) == '{"a": [2], "b": 1}'
