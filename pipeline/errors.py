"""The project's error types. The CLI prints one line per error and exits with `exit_code`."""


class PipeError(Exception):
    """An error pipe understands; its message is the whole user-facing line."""

    exit_code = 1


class InputError(PipeError):
    """Bad flag, config, data or artifact: the user can fix it."""

    exit_code = 2


class DivergedError(PipeError):
    """Training produced non-finite losses or parameters."""

    exit_code = 3


class GateError(PipeError):
    """A quality gate failed (export parity, int8 accuracy drop)."""

    exit_code = 4
