"""User-facing errors: one line that says what is wrong and what is expected."""


class EagleError(ValueError):
    """Bad input from a user (path, flag, model, checkpoint). The CLI prints it as one line."""
