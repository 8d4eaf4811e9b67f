"""The error every part of ``launch/`` raises for bad input from the user."""


class UsageError(Exception):
    """Bad input from the user; the message is one line, shown without a traceback."""
