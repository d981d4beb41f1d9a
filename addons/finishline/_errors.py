"""The core's one error type. Bad bytes from the upstream are never an error (they are data, passed
on and noted); exceptions are only for misuse of the API by the code that drives the core."""

__all__ = ["LocalProtocolError"]


class LocalProtocolError(RuntimeError):
    """The caller used the core wrongly (e.g. fed bytes after the end of the stream)."""
