import pytest

from tinyparse import ParseError, evaluate, parse


def test_integer_arithmetic():
    assert evaluate("1 + 2 * 3") == 7
    assert evaluate("(1 + 2) * 3") == 9


def test_left_associative_operators():
    assert evaluate("10 - 4 - 3") == 3
    assert evaluate("64 / 4 / 2") == 8
    assert evaluate("17 // 5 % 2") == 1


def test_unary_minus():
    assert evaluate("-3 + 5") == 2
    assert evaluate("2 * -3") == -6
    assert evaluate("--4") == 4


def test_simple_power():
    assert evaluate("2 ** 10") == 1024
    assert evaluate("3 ** 2 * 2") == 18


def test_floats():
    assert evaluate("0.5 + .25") == pytest.approx(0.75)


def test_variables_and_functions():
    assert evaluate("max(a, b) + abs(-c)", {"a": 1, "b": 5, "c": 2}) == 7
    assert evaluate("sqrt(16)") == 4.0


def test_syntax_tree_shape():
    assert parse("1 + x") == ("bin", "+", ("num", 1), ("var", "x", 4))


def test_unknown_variable_reports_column():
    with pytest.raises(ParseError) as info:
        evaluate("1 + y")
    assert info.value.column == 5


def test_unbalanced_parenthesis():
    with pytest.raises(ParseError, match="expected"):
        evaluate("(1 + 2")


def test_trailing_garbage():
    with pytest.raises(ParseError, match="unexpected"):
        evaluate("1 2")
