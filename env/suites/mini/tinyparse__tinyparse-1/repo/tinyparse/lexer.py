"""Tokenizer for arithmetic expressions."""

from dataclasses import dataclass

from tinyparse.errors import ParseError

NUMBER = "NUMBER"
NAME = "NAME"
OP = "OP"
END = "END"

# Longest first, so "**" is not read as two "*".
OPERATORS = ("**", "//", "+", "-", "*", "/", "%", "(", ")", ",")


@dataclass(frozen=True)
class Token:
    """One token. ``pos`` is the 0-based offset of its first character in the source."""

    kind: str
    text: str
    pos: int


def tokenize(source):
    """Split ``source`` into tokens, ending with an ``END`` token."""
    tokens = []
    index = 0
    length = len(source)
    while index < length:
        char = source[index]
        if char.isspace():
            index += 1
            continue
        if char.isdigit() or (char == "." and source[index + 1 : index + 2].isdigit()):
            end = index
            while end < length and (source[end].isdigit() or source[end] == "."):
                end += 1
            text = source[index:end]
            if text.count(".") > 1:
                raise ParseError(f"malformed number {text!r}", column=index + 1)
            tokens.append(Token(NUMBER, text, index))
            index = end
            continue
        if char.isalpha() or char == "_":
            end = index
            while end < length and (source[end].isalnum() or source[end] == "_"):
                end += 1
            tokens.append(Token(NAME, source[index:end], index))
            index = end
            continue
        for op in OPERATORS:
            if source.startswith(op, index):
                tokens.append(Token(OP, op, index))
                index += len(op)
                break
        else:
            raise ParseError(f"unexpected character {char!r}", column=index + 1)
    tokens.append(Token(END, "", length))
    return tokens
