"""Action spans of an assistant turn: function/parameter names, keyword values, copies from observations, new."""

from __future__ import annotations

import random

from agent_runner.parsing import parse_response
from measure.action_spans import Span, action_spans, call_layout, summarize

FILE = [
    "import sys",
    "",
    "",
    "class Parser:",
    "    def __init__(self, prog):",
    "        self.prog = prog",
    "        self.options = {}",
    "",
    "    def add(self, name, default=None):",
    "        if name in self.options:",
    "            raise ValueError(name)",
    "        self.options[name] = default",
    "        return self",
]
PATH = "/testbed/argkit/parser.py"
TASK = "Parser.add raises on a duplicate option; it should overwrite it instead."


def view(lines: list[str], first: int = 1, path: str = PATH) -> str:
    """A `file_editor view` observation: the header, then each line as f"{n:6d} {line}"."""
    body = "\n".join(f"{first + i:6d} {line}" for i, line in enumerate(lines))
    return f"Here's the result of running `cat -n` on the file: {path}:\n{body}"


def snippet(lines: list[str], first: int) -> str:
    """The snippet printed after str_replace / insert: each line as f"{n:6}\t{line}"."""
    body = "\n".join(f"{first + i:6}\t{line}" for i, line in enumerate(lines))
    return f"The file {PATH} has been edited. Here's the result of running `cat -n` on a snippet of {PATH}:\n{body}\n"


def call(name: str, **params: str) -> str:
    body = "".join(f"\n<parameter={key}>{value}</parameter>" for key, value in params.items())
    return f"<think>\nI will act.\n</think>\n\n<function={name}>{body}\n</function>"


def of(spans: list[Span], kind: str, param: str | None = None) -> list[Span]:
    return [s for s in spans if s.kind == kind and (param is None or s.param == param)]


def check_invariants(text: str, spans: list[Span]) -> None:
    """Text order, no overlap, and every non-blank character of each scored value in one copy/new span."""
    for a, b in zip(spans, spans[1:], strict=False):
        assert a.end <= b.start, (a, b)
    layout = call_layout(text)
    covered = [0] * len(text)
    for s in spans:
        assert s.start < s.end
        for k in range(s.start, s.end):
            covered[k] += 1
    for p in layout.params:
        value_spans = [s for s in spans if s.start >= p.value_start and s.end <= p.value_end]
        kinds = {s.kind for s in value_spans}
        assert kinds <= {"param"} or kinds <= {"copy", "new"}
        for k in range(p.value_start, p.value_end):
            if not text[k].isspace():
                assert covered[k] == 1, (p.key, k, text[k])


def test_old_str_copying_four_viewed_lines_is_one_copy_with_source_offsets():
    observations = [TASK, view(FILE)]
    old = "\n".join(FILE[8:12])  # the first line is indented in the file, stripped in the value
    text = call("file_editor", command="str_replace", path=PATH, old_str=old, new_str="self.options[name] = default")
    spans = action_spans(text, observations)
    check_invariants(text, spans)
    copies = of(spans, "copy", "old_str")
    assert len(copies) == 1
    (c,) = copies
    assert text[c.start : c.end] == old.strip()
    assert c.source == 1
    src = observations[1][c.source_start : c.source_end]
    assert src.startswith("def add(self, name, default=None):")  # indentation of the stripped first line skipped
    assert src.endswith("self.options[name] = default")
    for line in FILE[9:12]:
        assert f" {line}\n" in src + "\n"


def test_first_line_indented_in_file_but_stripped_in_value_still_matches():
    observations = [TASK, view(FILE)]
    old = "        if name in self.options:\n            raise ValueError(name)"  # parser strips the indentation
    text = call("file_editor", command="str_replace", path=PATH, old_str=old, new_str="pass")
    (c,) = of(action_spans(text, observations), "copy", "old_str")
    assert text[c.start : c.end] == old.strip()
    assert observations[1][c.source_start : c.source_end].startswith("if name in self.options:")


def test_value_mixing_copied_and_new_lines_gives_copy_and_new_spans():
    observations = [TASK, view(FILE)]
    new_str = "\n".join(
        [
            "def add(self, name, default=None):",
            "        # overwrite silently",
            "        log(name)",
            "        self.options[name] = default",
            "        return self",
        ]
    )
    text = call("file_editor", command="str_replace", path=PATH, old_str="x", new_str=new_str)
    spans = action_spans(text, observations)
    check_invariants(text, spans)
    kinds = [(s.kind, text[s.start : s.end]) for s in spans if s.param == "new_str"]
    assert kinds == [
        ("param", "new_str"),
        ("copy", "def add(self, name, default=None):"),
        ("new", "# overwrite silently\n        log(name)"),
        ("copy", "        self.options[name] = default\n        return self"),
    ]


def test_new_str_with_unseen_code_is_new():
    observations = [TASK, view(FILE)]
    new_str = "if name in self.seen:\n    warn(name)\n\nself.seen.add(name)"
    text = call("file_editor", command="str_replace", path=PATH, old_str="pass", new_str=new_str)
    spans = action_spans(text, observations)
    check_invariants(text, spans)
    (n,) = of(spans, "new", "new_str")
    assert text[n.start : n.end] == new_str
    assert not of(spans, "copy", "new_str")


def test_path_copied_from_a_view_header_is_a_copy():
    observations = [TASK, view(FILE)]
    text = call("file_editor", command="view", path=PATH)
    spans = action_spans(text, observations)
    (c,) = of(spans, "copy", "path")
    assert text[c.start : c.end] == PATH
    assert c.source == 1 and observations[1][c.source_start : c.source_end] == PATH
    assert of(action_spans(text, [TASK]), "new", "path")  # not seen yet: new


def test_execute_bash_cmd_is_new_and_keyword_value_is_param():
    text = call("execute_bash", cmd="cd /testbed && python -m pytest -q tests/test_parser.py")
    spans = action_spans(text, [TASK, view(FILE)])
    assert [(s.kind, text[s.start : s.end]) for s in spans] == [
        ("function", "execute_bash"),
        ("param", "cmd"),
        ("new", "cd /testbed && python -m pytest -q tests/test_parser.py"),
    ]
    finish = call("finish", command="submit")
    assert [(s.kind, finish[s.start : s.end]) for s in action_spans(finish, [TASK, "submit"])] == [
        ("function", "finish"),
        ("param", "command"),
        ("param", "submit"),
    ]
    text = call("file_editor", command="view", path="/nowhere")
    assert ("param", "view") in [(s.kind, text[s.start : s.end]) for s in action_spans(text, ["view view"])]


def test_most_recent_observation_holding_the_text_is_the_source():
    old = "\n".join(FILE[4:7])
    observations = [TASK, view(FILE), "$ ls\nparser.py", view(FILE[3:8], first=4)]
    text = call("file_editor", command="str_replace", path=PATH, old_str=old, new_str="pass")
    (c,) = of(action_spans(text, observations), "copy", "old_str")
    assert c.source == 3
    assert "self.options = {}" in observations[3][c.source_start : c.source_end]
    # a tie below the value's full length also goes to the most recent observation
    text = call("file_editor", command="str_replace", path=PATH, old_str=old + "\n        unseen_call()", new_str="x")
    copies = of(action_spans(text, observations), "copy", "old_str")
    assert [(c.source, text[c.start : c.end]) for c in copies] == [(3, old.strip())]
    # a longer run in an older observation beats a shorter one in a newer one
    longer = "\n".join(FILE[3:12])
    text = call("file_editor", command="str_replace", path=PATH, old_str=longer, new_str="pass")
    copies = of(action_spans(text, observations), "copy", "old_str")
    assert [(c.source, text[c.start : c.end]) for c in copies] == [(1, longer)]


def test_edit_snippet_with_tab_prefix_and_grep_lines_are_copy_sources():
    observations = [TASK, snippet(FILE[8:13], first=9), 'Matches for "raise" in ' + PATH + ":\n11:" + FILE[10]]
    old = "\n".join(FILE[9:12])
    text = call("file_editor", command="str_replace", path=PATH, old_str=old, new_str="pass")
    (c,) = of(action_spans(text, observations), "copy", "old_str")
    assert c.source == 1 and text[c.start : c.end] == old.strip()
    text = call("file_editor", command="str_replace", path=PATH, old_str=FILE[10], new_str="pass")
    (c,) = of(action_spans(text, observations), "copy", "old_str")
    assert c.source == 2 and observations[2][c.source_start : c.source_end] == FILE[10].strip()


def test_no_call_or_broken_call_gives_no_spans():
    assert action_spans("I think I am done.", [TASK]) == []
    assert action_spans("<function=file_editor><parameter=command>view</parameter>", [TASK]) == []  # truncated
    assert action_spans("<function=bad name!>x</function>", [TASK]) == []


def test_duplicate_parameter_keys_only_the_last_is_scored():
    text = (
        "<function=execute_bash>\n<parameter=cmd>ls /testbed/argkit</parameter>\n"
        "<parameter=cmd>cat /testbed/argkit/parser.py</parameter>\n</function>"
    )
    assert parse_response(text).call.arguments == {"cmd": "cat /testbed/argkit/parser.py"}
    spans = action_spans(text, [TASK])
    check_invariants(text, spans)
    last = text.rindex("<parameter=cmd>")
    assert summarize(spans) == {"function": 1, "param": 1, "copy": 0, "new": 1}
    assert all(s.start > last for s in spans if s.kind != "function")


def test_run_never_starts_or_ends_on_a_blank_line():
    observations = [TASK, view(FILE)]
    # "" then "class Parser:": the file has blank lines before it, but the copy starts at the class line
    new_str = "import sys\n\n\n\nclass Parser:\n    pass"
    text = call("file_editor", command="create", path="/testbed/x.py", file_text=new_str)
    spans = action_spans(text, observations)
    check_invariants(text, spans)
    got = [(s.kind, text[s.start : s.end]) for s in spans if s.param == "file_text"]
    # "import sys" + 2 blanks match the file, but the 3rd blank does not; the run ends on "import sys"
    assert got[1] == ("copy", "import sys")
    assert ("copy", "class Parser:") in got
    for s in spans:
        if s.kind == "copy":
            assert text[s.start].strip() and text[s.end - 1].strip()
    assert ("new", "pass") in got


def test_short_lines_are_not_copies_alone():
    observations = [TASK, "x = 10\nx = 1\nreturn"]
    text = call("execute_bash", cmd="x = 1")  # a whole line, but only 3 non-blank characters
    assert of(action_spans(text, observations), "new", "cmd")
    text = call("execute_bash", cmd="x = 10")  # a whole line with 4 (a substring copy would need 6)
    assert of(action_spans(text, observations), "copy", "cmd")
    text = call("execute_bash", cmd="= 10")  # 3 characters of a line: too short for a substring copy
    assert of(action_spans(text, observations), "new", "cmd")


def test_substring_copy_of_a_test_id_and_span_invariants_on_random_edits():
    pytest_out = "FAILED tests/test_parser.py::test_add_duplicate - ValueError: verbose\n1 failed in 0.02s"
    observations = [TASK, view(FILE), pytest_out]
    cmd = "python -m pytest -q \\\n  tests/test_parser.py::test_add_duplicate"
    text = call("execute_bash", cmd=cmd)
    spans = action_spans(text, observations)
    check_invariants(text, spans)
    (c,) = of(spans, "copy", "cmd")
    assert text[c.start : c.end] == "tests/test_parser.py::test_add_duplicate" and c.source == 2
    assert observations[2][c.source_start : c.source_end] == text[c.start : c.end]
    rng = random.Random(7)
    pool = FILE + ["    new_line(a, b)", "", "  ", "zz", "return other"]
    for _ in range(200):
        value = "\n".join(rng.choice(pool) for _ in range(rng.randint(1, 12)))
        text = call("file_editor", command="str_replace", path=PATH, old_str=value, new_str=value[::-1])
        spans = action_spans(text, observations)
        check_invariants(text, spans)
        for s in spans:
            if s.kind == "copy":
                assert observations[s.source][s.source_start : s.source_end].strip()


def test_last_line_matches_an_observation_line_with_trailing_whitespace():
    lines = FILE[:12] + ["        return self   "]  # trailing blanks in the file; the value's are stripped
    observations = [TASK, view(lines)]
    old = "\n".join(FILE[10:13])
    text = call("file_editor", command="str_replace", path=PATH, old_str=old + "   \n", new_str="pass")
    (c,) = of(action_spans(text, observations), "copy", "old_str")
    assert text[c.start : c.end] == old.strip()
    assert observations[1][c.source_start : c.source_end].endswith("return self")
    # an interior line must match as is: trailing blanks in the file but not in the value break the run
    text = call("file_editor", command="str_replace", path=PATH, old_str=old + "\nmore()", new_str="pass")
    copies = of(action_spans(text, observations), "copy", "old_str")
    assert [text[c.start : c.end] for c in copies] == ["\n".join(FILE[10:12]).strip(), "return self"]


def test_tabs_compare_expanded_as_in_edit_snippets():
    observations = [TASK, snippet(["def f():", "\treturn compute(a)".expandtabs()], first=1)]
    text = call("file_editor", command="str_replace", path=PATH, old_str="def f():\n\treturn compute(a)", new_str="x")
    (c,) = of(action_spans(text, observations), "copy", "old_str")
    assert text[c.start : c.end] == "def f():\n\treturn compute(a)"
    assert observations[1][c.source_start : c.source_end] == "def f():\n     2\t        return compute(a)"
