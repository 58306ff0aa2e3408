import pytest

from tinyparse import ParseError, read_records, read_rows, split_row


def test_plain_fields():
    assert split_row("a,b,c") == ["a", "b", "c"]


def test_quoted_field_with_delimiter():
    assert split_row('1,"Smith, John",x') == ["1", "Smith, John", "x"]


def test_doubled_quotes():
    assert split_row('"say ""hi""",2') == ['say "hi"', "2"]


def test_empty_middle_field():
    assert split_row("a,,c") == ["a", "", "c"]


def test_other_delimiter():
    assert split_row("a;b", delimiter=";") == ["a", "b"]


def test_unterminated_quote():
    with pytest.raises(ParseError, match="unterminated"):
        split_row('a,"b')


def test_read_rows_skips_blank_lines():
    assert read_rows("a,b\n\nc,d\n") == [["a", "b"], ["c", "d"]]


def test_records():
    text = "name,qty\napple,3\npear,5\n"
    assert read_records(text) == [{"name": "apple", "qty": "3"}, {"name": "pear", "qty": "5"}]


def test_record_with_wrong_width():
    with pytest.raises(ParseError) as info:
        read_records("a,b\n1,2,3\n")
    assert info.value.line == 2
