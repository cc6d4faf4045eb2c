"""Errors a user can act on: the CLI prints their message without a traceback and exits non-zero."""


class UserFacingError(RuntimeError):
    pass
