"""In-container side of the `file_editor` tool (R2E-Gym `r2egym` scaffold semantics and messages).

Installed by `env.sandbox.tools.ToolBox.install()` as /usr/local/bin/file_editor with a shebang for the container's
interpreter; it must stay runnable by Python 3.6+ with the standard library only (no chardet needed).
Commands: view | create | str_replace | insert | undo_edit. Undo history (the previous full text per path)
lives in /var/tmp/editor_state.json, so it survives between calls. Errors print `ERROR: ...`, exit code 0.

Text model (what every message, line number and match is computed on): the file decoded (a BOM's codec,
else UTF-8, else Latin-1) with universal newlines (CRLF and lone CR read as LF), as R2E-Gym's
`Path.read_text` does. Written back: in the file's own encoding and, for a file whose line ends were all CRLF,
with CRLF again, so an edit changes only the edited lines (R2E-Gym rewrites such files as UTF-8 + LF).
"""

import argparse
import ast
import io
import json
import os
import pathlib
import re
import subprocess
import sys
import traceback

STATE_FILE = "/var/tmp/editor_state.json"
SNIPPET_LINES = 4
MAX_RESPONSE_LEN = 10000
CONCISE_ABOVE_LINES = 110
CLIP_NOTE = (
    "<response clipped><NOTE>To save on context only part of this file has been shown to you. You should "
    "retry this tool after you have searched inside the file with `grep -n` in order to find the line "
    "numbers of what you are looking for.</NOTE>"
)
LINT_HEADER = (
    "Your proposed edit has introduced new syntax error(s).\n"
    "Please read this error message carefully and then retry editing the file.\nERRORS:\n"
)
CONCISE_HEADER = (
    "Here is a condensed view for file: {path}; [Note: Useful for understanding file structure in a concise "
    "manner. Please use specific view_range without concise cmd if you want to explore further into the "
    "relevant parts.]\n"
)
# longest first: the UTF-32 LE mark starts with the UTF-16 LE one
BOMS = (
    (b"\xff\xfe\x00\x00", "utf-32-le"),
    (b"\x00\x00\xfe\xff", "utf-32-be"),
    (b"\xef\xbb\xbf", "utf-8"),
    (b"\xff\xfe", "utf-16-le"),
    (b"\xfe\xff", "utf-16-be"),
)


class EditorError(Exception):
    pass


def clip(text):
    if len(text) <= MAX_RESPONSE_LEN:
        return text
    return text[:MAX_RESPONSE_LEN] + CLIP_NOTE


def is_python(path):
    """`.py` suffix as pathlib sees it (a file named `.py` has none)."""
    return pathlib.PurePosixPath(path).suffix == ".py"


def decode(raw):
    """(text with universal newlines, codec, BOM bytes, True if every line end was CRLF)."""
    text, codec, bom = None, "utf-8", b""
    for mark, name in BOMS:
        if raw.startswith(mark):
            try:
                text, codec, bom = raw[len(mark) :].decode(name), name, mark
                break
            except UnicodeDecodeError:
                pass
    if text is None:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            text, codec = raw.decode("latin-1"), "latin-1"
    lf, crlf = text.count("\n"), text.count("\r\n")
    all_crlf = crlf > 0 and crlf == lf == text.count("\r")
    return text.replace("\r\n", "\n").replace("\r", "\n"), codec, bom, all_crlf


def read_file(path):
    """The file's text (see the module docstring) and how to write it back: (codec, bom, crlf)."""
    with open(path, "rb") as handle:
        text, codec, bom, crlf = decode(handle.read())
    return text, (codec, bom, crlf)


def write_file(path, text, style=("utf-8", b"", False)):
    codec, bom, crlf = style
    if crlf:
        text = re.sub(r"\r?\n", "\r\n", text)
    try:
        data = bom + text.encode(codec)
    except UnicodeEncodeError:  # new text the old encoding cannot hold: UTF-8, as R2E-Gym writes every file
        data = text.encode("utf-8", "surrogateescape")
    try:
        with open(path, "wb") as handle:
            handle.write(data)
    except Exception as exc:
        raise EditorError(f"Failed to write file {path}: {exc}") from None


def load_history():
    try:
        with open(STATE_FILE, encoding="utf-8") as handle:
            return {key: value for key, value in json.load(handle).items()}
    except FileNotFoundError:
        return {}
    except Exception as exc:
        print(f"Warning: Could not load editor history from {STATE_FILE}: {exc}")
        return {}


def save_history(history):
    try:
        with open(STATE_FILE, "w", encoding="utf-8") as handle:
            json.dump(history, handle)
    except Exception as exc:
        print(f"Warning: Could not write editor history to {STATE_FILE}: {exc}")


def numbered(content, descriptor, first_line=1):
    """The `cat -n`-style block used after create / edits / undo (tab after the number)."""
    lines = clip(content).expandtabs().split("\n")
    body = "\n".join(f"{first_line + i:6}\t{line}" for i, line in enumerate(lines))
    return f"Here's the result of running `cat -n` on {descriptor}:\n{body}\n"


def syntax_problem(text, path, enabled):
    if not enabled or not is_python(path):
        return ""
    try:
        ast.parse(text, filename=path)
    except SyntaxError as exc:
        return LINT_HEADER + str(exc)
    return ""


def last_line_in(node):
    """The largest `lineno` in a subtree (how the span of a node is found without `end_lineno`)."""
    best = getattr(node, "lineno", 0)
    for child in ast.iter_child_nodes(node):
        best = max(best, last_line_in(child))
    return best


def is_string_statement(node):
    if not isinstance(node, ast.Expr):
        return False
    value = node.value
    if isinstance(value, ast.Constant) and isinstance(value.value, str):
        return True
    return sys.version_info < (3, 8) and isinstance(value, ast.Str)  # 3.6/3.7 parse strings to ast.Str


def elided_ranges(tree):
    """0-based inclusive line ranges to hide: function bodies spanning 4+ lines, inner lines of long class
    docstrings. With `end_lineno` (3.8+) a span is exact; before it the deepest `lineno` bounds it (and a
    function's docstring lines are counted back from its first statement)."""
    ranges = []
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            last = node.body[-1]
            first = node.body[0].lineno - 1
            if getattr(last, "end_lineno", None):
                end = last.end_lineno - 1
            else:
                doc = ast.get_docstring(node)
                if doc:
                    first -= doc.count("\n") + 1
                end = last_line_in(last) - 1
            if end - first >= 3:
                ranges.append((first, end))
        if isinstance(node, ast.ClassDef) and node.body and is_string_statement(node.body[0]):
            doc = node.body[0]
            if getattr(doc, "end_lineno", None):
                start, end = doc.lineno - 1, doc.end_lineno - 1
            else:
                start, end = node.lineno, last_line_in(doc) - 1
            if end - start >= 4:
                ranges.append((start + 1, end - 1))
    return ranges


def elided_lines(path, text):
    """(0-based line index, text) pairs with the elided ranges replaced by one note each."""
    try:
        tree = ast.parse(text, filename=path)
    except SyntaxError as exc:
        raise EditorError(f"Syntax error for file {path}: {exc}") from None
    ranges = elided_ranges(tree)
    hidden = set()
    for start, end in ranges:
        hidden.update(range(start, end + 1))
    notes = [(start, f"... eliding lines {start + 1}-{end + 1} ...") for start, end in ranges]
    kept = [(i, line) for i, line in enumerate(text.splitlines()) if i not in hidden]
    return sorted(notes + kept, key=lambda pair: pair[0])


def view_directory(path):
    cmd = ["find", path, "-maxdepth", "2", "-not", "-path", "*/.*", "(", "-type", "d", "-o", "-name", "*.py", ")"]
    try:
        proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, universal_newlines=True)
        out, err = proc.communicate()
    except Exception as exc:
        return "", f"Ran into {exc} while trying to list directory contents of {path}."
    if err.strip():
        return "", err.strip()
    listing = f"Here's the files and directories up to 2 levels deep in {path}, excluding hidden:\n"
    return clip(listing + out), ""


def view(path, view_range, concise):
    if os.path.isdir(path):
        return view_directory(path)
    if not is_python(path):
        name = pathlib.PurePosixPath(path).name
        return "", (
            f"ERROR: Viewing non-Python files is disallowed for saving context. File '{name}' is not a .py file."
        )
    text = read_file(path)[0]
    if not view_range and not concise and len(text.splitlines()) > CONCISE_ABOVE_LINES:
        concise = True
    pairs = elided_lines(path, text) if concise else list(enumerate(text.splitlines()))
    total = len(pairs)
    if view_range and len(view_range) == 2:
        start, end = view_range
        if not 1 <= start <= total:
            return "", f"Invalid view_range {view_range}: start line must be in [1, {total}]"
        if end != -1 and (end < start or end > total):
            return "", (
                f"Invalid view_range {view_range}: end must be >= start and <= {total}, or -1 to view until end."
            )
        pairs = [(i, line) for i, line in pairs if i + 1 >= start and (end == -1 or i + 1 <= end)]
    if concise:
        header = CONCISE_HEADER.format(path=path)
    else:
        header = f"Here's the result of running `cat -n` on the file: {path}:\n"
    body = "\n".join(f"{i + 1:6d} {line}" for i, line in pairs)
    return clip(header + body), ""


def create(path, file_text, history, lint):
    if file_text is None:
        raise EditorError("Cannot create file without 'file_text' parameter.")
    problem = syntax_problem(file_text, path, lint)
    if problem:
        return "", problem
    try:
        with open(path, "w", encoding="utf-8") as handle:
            handle.write(file_text)
        history.setdefault(path, []).append("")
    except Exception as exc:
        raise EditorError(f"Error creating file at {path}: {exc}") from None
    return (
        f"File created at {path}. "
        + numbered(file_text, path)
        + "Review the file and make sure that it is as expected. Edit the file if necessary."
    ), ""


def read_for_edit(path):
    try:
        return read_file(path)
    except Exception as exc:
        raise EditorError(f"Failed to read file {path}: {exc}") from None


def str_replace(path, old_str, new_str, history, lint):
    if old_str is None:
        raise EditorError("Missing required parameter 'old_str' for 'str_replace'.")
    new_str = new_str or ""
    content, style = read_for_edit(path)
    count = content.count(old_str)
    if count == 0:
        raise EditorError(f"No occurrences of '{old_str}' found in {path} for replacement.")
    if count > 1:
        raise EditorError(
            f"Multiple occurrences of '{old_str}' found in {path}. Please ensure it is unique before using str_replace."
        )
    updated = content.replace(old_str, new_str)
    problem = syntax_problem(updated, path, lint)
    if problem:
        return "", problem
    history.setdefault(path, []).append(content)
    write_file(path, updated, style)
    at_line = content.split(old_str)[0].count("\n")
    first = max(0, at_line - SNIPPET_LINES)
    last = at_line + SNIPPET_LINES + new_str.count("\n")
    snippet = "\n".join(updated.split("\n")[first : last + 1])
    return (
        f"The file {path} has been edited. "
        + numbered(snippet, "a snippet of " + path, first + 1)
        + "Review the changes and make sure they are as expected. Edit the file again if necessary."
    ), ""


def insert(path, insert_line, new_str, history, lint):
    if new_str is None:
        raise EditorError("Missing required parameter 'new_str' for 'insert'.")
    if insert_line is None:
        raise EditorError("Missing required parameter 'insert_line' for 'insert'.")
    content, style = read_for_edit(path)
    lines = content.split("\n")
    if insert_line < 0 or insert_line > len(lines):
        raise EditorError(f"Invalid insert_line {insert_line}. Must be in [0, {len(lines)}].")
    added = new_str.split("\n")
    updated = "\n".join(lines[:insert_line] + added + lines[insert_line:])
    problem = syntax_problem(updated, path, lint)
    if problem:
        return "", problem
    history.setdefault(path, []).append(content)
    write_file(path, updated, style)
    snippet = "\n".join(
        lines[max(0, insert_line - SNIPPET_LINES) : insert_line]
        + added
        + lines[insert_line : insert_line + SNIPPET_LINES]
    )
    first = max(1, insert_line - SNIPPET_LINES + 1)
    return (
        f"The file {path} has been edited. "
        + numbered(snippet, "a snippet of the edited file", first)
        + "Review the changes and make sure they are as expected (correct indentation, no duplicate lines, "
        "etc). Edit the file again if necessary."
    ), ""


def undo_edit(path, history):
    stack = history.get(path) or []
    if not stack:
        raise EditorError(f"No previous edits found for {path} to undo.")
    previous = stack.pop()
    try:
        style = read_file(path)[1]  # the file keeps the encoding and line ends our edits gave it
    except Exception:
        style = ("utf-8", b"", False)
    write_file(path, previous, style)
    return f"Last edit to {path} undone successfully. " + numbered(previous, path), ""


def check_path(command, path):
    if path is None:
        raise EditorError("Missing required parameter 'path'.")
    if command == "create":
        if os.path.exists(path):
            raise EditorError(f"File already exists at: {path}. Cannot overwrite with 'create'.")
    elif not os.path.exists(path):
        raise EditorError(f"The path '{path}' does not exist.")
    if os.path.isdir(path) and command != "view":
        raise EditorError(f"The path '{path}' is a directory. Only 'view' can be used on directories.")


def run(args, history):
    check_path(args.command, args.path)
    lint = bool(args.enable_linting)  # as R2E-Gym's argparse `type=bool`: any non-empty value, even "false"
    if args.command == "view":
        return view(args.path, args.view_range, args.concise.lower() == "true")
    if args.command == "create":
        return create(args.path, args.file_text, history, lint)
    if args.command == "str_replace":
        return str_replace(args.path, args.old_str, args.new_str, history, lint)
    if args.command == "insert":
        return insert(args.path, args.insert_line, args.new_str, history, lint)
    if args.command == "undo_edit":
        return undo_edit(args.path, history)
    raise EditorError(
        f"Unrecognized command '{args.command}'. Allowed commands: view, create, str_replace, insert, undo_edit."
    )


def parse_range(text):
    text = text.strip().strip("[]()")
    parts = text.replace(",", " ").split()
    if len(parts) != 2:
        raise argparse.ArgumentTypeError(f"Expected two numbers, got: {text}")
    try:
        return [int(parts[0]), int(parts[1])]
    except ValueError:
        raise argparse.ArgumentTypeError(f"Could not convert {parts} to integers.") from None


def main():
    if hasattr(sys.stdout, "buffer"):
        sys.stdout = io.TextIOWrapper(sys.stdout.buffer, encoding="utf-8", errors="replace")
    # the same options in the same order as R2E-Gym's editor, so argparse's usage/error text is the same
    parser = argparse.ArgumentParser(description="view / create / str_replace / insert / undo_edit files")
    parser.add_argument("command")
    parser.add_argument("--path")
    parser.add_argument("--file_text")
    parser.add_argument("--view_range", type=parse_range)
    parser.add_argument("--old_str")
    parser.add_argument("--new_str")
    parser.add_argument("--insert_line", type=int)
    parser.add_argument("--enable_linting", default="")
    parser.add_argument("--concise", default="False")
    parser.add_argument("--python_only", default="true")  # accepted and ignored, as in R2E-Gym
    args = parser.parse_args()
    if args.path is not None:
        args.path = str(pathlib.PurePosixPath(args.path))  # R2E-Gym's Path(): drops `//`, `/./`, a trailing `/`
    history = load_history()
    try:
        output, error = run(args, history)
        print(output)
        if error:
            print("ERROR: " + error)
    except EditorError as exc:
        print(f"ERROR: {exc}")
    except Exception as exc:
        print(f"ERROR: Unhandled exception: {exc}")
        traceback.print_exc()
    save_history(history)


if __name__ == "__main__":
    main()
