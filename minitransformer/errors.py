"""Errors a user can fix (bad flag, missing file, unknown character, ...).

The CLI prints a ``UserError`` as one line and exits with code 2; anything else is a bug
and exits with code 1.
"""


class UserError(Exception):
    """Something the user can fix; its message is shown as-is, with no traceback."""


class ConfigError(UserError, ValueError):
    """An impossible or unknown configuration value."""
