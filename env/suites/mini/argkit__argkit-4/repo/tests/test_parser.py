import pytest

from argkit import ArgError, Namespace, Parser


def make_parser():
    parser = Parser("tool", description="Does things.")
    parser.add_option("-v", "--verbose", action="count", help="more output")
    parser.add_option("-q", "--quiet", action="store_true")
    parser.add_option("-o", "--output", help="where to write", metavar="FILE")
    parser.add_option("--jobs", type=int, default=1)
    parser.add_argument("source")
    parser.add_argument("dest", optional=True, default="out")
    return parser


def test_positionals_and_defaults():
    args = make_parser().parse(["in.txt"])
    assert args == Namespace(help=False, verbose=0, quiet=False, output=None, jobs=1, source="in.txt", dest="out")


def test_long_option_forms():
    parser = make_parser()
    assert parser.parse(["--output", "a", "x"]).output == "a"
    assert parser.parse(["--output=b", "x"]).output == "b"


def test_short_option_forms():
    parser = make_parser()
    assert parser.parse(["-o", "a", "x"]).output == "a"
    assert parser.parse(["-ob", "x"]).output == "b"


def test_flag_groups_and_counts():
    args = make_parser().parse(["-vvq", "-v", "x"])
    assert args.verbose == 3
    assert args.quiet is True


def test_type_conversion():
    assert make_parser().parse(["--jobs", "4", "x"]).jobs == 4


def test_invalid_type():
    with pytest.raises(ArgError, match="--jobs: invalid int value: 'many'"):
        make_parser().parse(["--jobs", "many", "x"])


def test_unknown_option():
    with pytest.raises(ArgError, match="unknown option --colour"):
        make_parser().parse(["--colour", "x"])


def test_missing_value():
    with pytest.raises(ArgError, match="--output: expected a value"):
        make_parser().parse(["x", "--output"])


def test_flag_with_inline_value():
    with pytest.raises(ArgError, match="does not take a value"):
        make_parser().parse(["--quiet=yes", "x"])


def test_missing_and_extra_arguments():
    parser = make_parser()
    with pytest.raises(ArgError, match="missing argument"):
        parser.parse([])
    with pytest.raises(ArgError, match="unexpected argument"):
        parser.parse(["a", "b", "c"])


def test_required_option():
    parser = Parser("deploy")
    parser.add_option("--env", required=True)
    with pytest.raises(ArgError, match="missing required option"):
        parser.parse([])
    assert parser.parse(["--env", "prod"]).env == "prod"


def test_append():
    parser = Parser("tool")
    parser.add_option("-I", "--include", action="append")
    assert parser.parse(["-I", "a", "--include", "b"]).include == ["a", "b"]


def test_bool_type():
    parser = Parser("tool")
    parser.add_option("--color", type=bool, default=True)
    assert parser.parse(["--color", "no"]).color is False
    assert parser.parse(["--color=ON"]).color is True


def test_string_choices():
    parser = Parser("tool")
    parser.add_option("--mode", choices=["fast", "safe"], default="safe")
    assert parser.parse(["--mode", "fast"]).mode == "fast"
    with pytest.raises(ArgError, match="invalid choice 'slow'"):
        parser.parse(["--mode", "slow"])


def test_single_dash_is_positional():
    assert make_parser().parse(["-"]).source == "-"
