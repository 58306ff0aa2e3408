from humanfmt import intcomma, ordinal, percent


def test_intcomma_integers():
    assert intcomma(0) == "0"
    assert intcomma(999) == "999"
    assert intcomma(1000) == "1,000"
    assert intcomma(1234567) == "1,234,567"


def test_intcomma_negative_integer():
    assert intcomma(-1234567) == "-1,234,567"


def test_intcomma_with_decimals():
    assert intcomma(1234567.891, ndigits=2) == "1,234,567.89"
    assert intcomma(1000, ndigits=1) == "1,000.0"


def test_intcomma_rounds_half_up():
    assert intcomma(2.5, ndigits=0) == "3"
    assert intcomma(0.125, ndigits=2) == "0.13"


def test_intcomma_custom_separator():
    assert intcomma(1234567, sep=".") == "1.234.567"


def test_ordinal_basic():
    assert [ordinal(n) for n in (1, 2, 3, 4, 10)] == ["1st", "2nd", "3rd", "4th", "10th"]


def test_ordinal_teens():
    assert [ordinal(n) for n in (11, 12, 13)] == ["11th", "12th", "13th"]


def test_ordinal_twenties():
    assert [ordinal(n) for n in (21, 22, 23, 24)] == ["21st", "22nd", "23rd", "24th"]


def test_percent():
    assert percent(0.256) == "26%"
    assert percent(0.2561, ndigits=1) == "25.6%"
    assert percent(1) == "100%"
