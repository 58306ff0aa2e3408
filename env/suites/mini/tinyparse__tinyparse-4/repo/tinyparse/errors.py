"""The single exception type raised by every tinyparse parser."""


class ParseError(ValueError):
    """Malformed input.

    ``line`` and ``column`` are 1-based positions when the parser knows them, so
    they can be shown to a user as-is.
    """

    def __init__(self, message, *, line=None, column=None):
        self.message = message
        self.line = line
        self.column = column
        super().__init__(self._render())

    def _render(self):
        where = []
        if self.line is not None:
            where.append(f"line {self.line}")
        if self.column is not None:
            where.append(f"column {self.column}")
        if not where:
            return self.message
        return f"{', '.join(where)}: {self.message}"
