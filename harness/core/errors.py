"""Errors that more than one layer raises or catches (the torch-dependent ones live in runtime/errors.py)."""


class ConfigError(ValueError):
    """An invalid config; str(err) is the one line shown to the user."""
