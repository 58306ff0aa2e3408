from argkit import Parser


def test_usage_line():
    parser = Parser("tool")
    parser.add_argument("source")
    parser.add_argument("dest", optional=True)
    assert parser.format_help().splitlines()[0] == "usage: tool [options] source [dest]"


def test_options_listed_with_help_and_defaults():
    parser = Parser("tool", description="Copies things.")
    parser.add_option("-o", "--output", help="where to write", metavar="FILE")
    parser.add_option("--jobs", type=int, default=4, help="parallel jobs")
    text = parser.format_help()
    assert "Copies things." in text
    assert "-o, --output FILE" in text
    assert "parallel jobs (default: 4)" in text
    assert "-h, --help" in text


def test_long_help_is_wrapped():
    parser = Parser("tool")
    parser.add_option("--mode", help="word " * 40)
    assert all(len(line) <= 60 for line in parser.format_help(width=60).splitlines())
