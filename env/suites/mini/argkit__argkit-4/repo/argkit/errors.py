"""Errors raised while parsing a command line."""


class ArgError(Exception):
    """The command line is invalid. ``str(error)`` is the message shown to the user."""

    exit_code = 2

    def __init__(self, message):
        super().__init__(message)
        self.message = message
