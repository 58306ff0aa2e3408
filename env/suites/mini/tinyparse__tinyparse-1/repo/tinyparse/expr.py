"""A safe arithmetic evaluator (no ``eval``).

Grammar, loosest binding first, following Python's rules::

    + -          left-associative
    * / // %     left-associative
    unary - +    binds tighter than * but looser than **, so -2 ** 2 == -4
    **           right-associative, so 2 ** 3 ** 2 == 2 ** 9

Operands are numbers, variable names and calls of ``FUNCTIONS``.
Syntax trees are tuples: ``("num", value)``, ``("var", name, pos)``,
``("neg", operand)``, ``("bin", op, left, right)``, ``("call", name, args, pos)``.
"""

import math
import operator

from tinyparse.errors import ParseError
from tinyparse.lexer import END, NAME, NUMBER, OP, tokenize

# operator -> (binding power, right-associative?)
BINARY = {
    "+": (10, False),
    "-": (10, False),
    "*": (20, False),
    "/": (20, False),
    "//": (20, False),
    "%": (20, False),
    "**": (30, True),
}
UNARY_POWER = 25

OPERATIONS = {
    "+": operator.add,
    "-": operator.sub,
    "*": operator.mul,
    "/": operator.truediv,
    "//": operator.floordiv,
    "%": operator.mod,
    "**": operator.pow,
}

FUNCTIONS = {"abs": abs, "min": min, "max": max, "round": round, "sqrt": math.sqrt}


class _Parser:
    def __init__(self, source):
        self.tokens = tokenize(source)
        self.index = 0

    def peek(self):
        return self.tokens[self.index]

    def advance(self):
        token = self.tokens[self.index]
        self.index += 1
        return token

    def expect(self, text):
        token = self.advance()
        if token.text != text:
            found = token.text or "end of input"
            raise ParseError(f"expected {text!r}, found {found!r}", column=token.pos + 1)
        return token

    def parse(self):
        node = self.expression(0)
        token = self.peek()
        if token.kind != END:
            raise ParseError(f"unexpected {token.text!r}", column=token.pos + 1)
        return node

    def expression(self, min_power):
        left = self.prefix()
        while True:
            token = self.peek()
            if token.kind != OP or token.text not in BINARY:
                return left
            power, right_assoc = BINARY[token.text]
            if power <= min_power:
                return left
            self.advance()
            right = self.expression(power)
            left = ("bin", token.text, left, right)

    def prefix(self):
        token = self.advance()
        if token.kind == NUMBER:
            value = float(token.text) if "." in token.text else int(token.text)
            return ("num", value)
        if token.kind == NAME:
            if self.peek().text == "(":
                return self.call(token)
            return ("var", token.text, token.pos)
        if token.text in ("-", "+"):
            operand = self.expression(UNARY_POWER)
            return ("neg", operand) if token.text == "-" else operand
        if token.text == "(":
            node = self.expression(0)
            self.expect(")")
            return node
        found = token.text or "end of input"
        raise ParseError(f"unexpected {found!r}", column=token.pos + 1)

    def call(self, name_token):
        self.expect("(")
        args = []
        if self.peek().text != ")":
            args.append(self.expression(0))
            while self.peek().text == ",":
                self.advance()
                args.append(self.expression(0))
        self.expect(")")
        return ("call", name_token.text, tuple(args), name_token.pos)


def parse(source):
    """Parse an expression into a syntax tree (see the module docstring)."""
    return _Parser(source).parse()


def _evaluate(node, variables):
    kind = node[0]
    if kind == "num":
        return node[1]
    if kind == "var":
        _, name, pos = node
        if name not in variables:
            raise ParseError(f"unknown variable {name!r}", column=pos + 1)
        return variables[name]
    if kind == "neg":
        return -_evaluate(node[1], variables)
    if kind == "bin":
        _, op, left, right = node
        return OPERATIONS[op](_evaluate(left, variables), _evaluate(right, variables))
    _, name, args, pos = node
    if name not in FUNCTIONS:
        raise ParseError(f"unknown function {name!r}", column=pos + 1)
    return FUNCTIONS[name](*(_evaluate(arg, variables) for arg in args))


def evaluate(source, variables=None):
    """Evaluate an expression; ``variables`` maps names to numbers.

    Division by zero raises ``ZeroDivisionError`` as in Python.
    """
    return _evaluate(parse(source), dict(variables or {}))
