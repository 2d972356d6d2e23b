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
    """An accuracy gate failed (int8 accuracy drop over compress.max_drop)."""

    exit_code = 4


class Int8GateError(GateError):
    """compress's int8 gate: no int8 variant within compress.max_drop (or none shippable on this CPU)."""


class ParityError(GateError):
    """A converted model disagrees with the one it came from (export parity, ONNX parity)."""

    exit_code = 5


class ArtifactError(PipeError):
    """`pipe all`: an artifact it wrote is missing or no longer verifies (changed after it was made)."""

    exit_code = 6
