"""User-facing errors and warnings: one line that says what is wrong and what is expected."""

import sys


class EagleError(ValueError):
    """Bad input from a user (path, flag, model, checkpoint). The CLI prints it as one line."""


def warn(text: str) -> None:
    """One `eagle-jax: warning:` line on stderr: the work goes on, but the user should know."""
    print(f"eagle-jax: warning: {text}", file=sys.stderr, flush=True)
