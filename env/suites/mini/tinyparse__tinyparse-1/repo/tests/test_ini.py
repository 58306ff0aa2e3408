import pytest

from tinyparse import IniFile, ParseError, parse_ini

SAMPLE = """\
# global settings
name = demo

[server]
Host = example.org
port = 8080
debug = yes

[paths]
search = /usr/lib,
    /opt/lib
"""


def test_sections_and_values():
    doc = IniFile.from_string(SAMPLE)
    assert doc.sections() == ["server", "paths"]
    assert doc.get("server", "host") == "example.org"


def test_keys_are_case_insensitive():
    doc = IniFile.from_string(SAMPLE)
    assert doc.get("server", "HOST") == "example.org"


def test_default_section_is_inherited():
    doc = IniFile.from_string(SAMPLE)
    assert doc.get("server", "name") == "demo"


def test_typed_getters():
    doc = IniFile.from_string(SAMPLE)
    assert doc.getint("server", "port") == 8080
    assert doc.getbool("server", "debug") is True
    assert doc.getlist("paths", "search") == ["/usr/lib", "/opt/lib"]


def test_missing_option():
    doc = IniFile.from_string(SAMPLE)
    assert doc.get("server", "timeout", "30") == "30"
    with pytest.raises(KeyError):
        doc.get("server", "timeout")


def test_comments_are_ignored():
    assert parse_ini("; note\n[a]\n# another\nx = 1\n") == {"DEFAULT": {}, "a": {"x": "1"}}


def test_line_without_equals_sign():
    with pytest.raises(ParseError) as info:
        parse_ini("[a]\njust words\n")
    assert info.value.line == 2


def test_unclosed_section():
    with pytest.raises(ParseError, match="unclosed"):
        parse_ini("[broken\n")
