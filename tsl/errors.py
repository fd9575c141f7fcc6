"""The typed errors of tsl.

Every error a user can provoke is one of these four, and its message names the thing to change
(the file and key, the tile and level, the operator argument, the package to install).
"""


class TSLError(Exception):
    """Base class of every tsl error."""


class TAMError(TSLError, ValueError):
    """A machine description (TAM file) is malformed: the message names the file, table and key."""


class ScheduleError(TSLError, ValueError):
    """A schedule does not fit the machine or the operator: names the primitive, tile and level."""


class LoweringError(TSLError, RuntimeError):
    """A valid schedule could not be turned into code for a back end (the message says why and
    what to change); wraps the TVM error where there was one."""


class BackendUnavailable(TSLError, RuntimeError):
    """A back end, or one of its optional dependencies (jaxlib, a GPU, nvcc), is not available
    here; the message says what to install."""


class OptionError(TSLError, TypeError):
    """A build option a back end does not take (a misspelled keyword of `tsl.build`), or one of
    the wrong type: the message names the back end and the options it takes."""


class InputError(TSLError, ValueError):
    """Arrays passed to an artifact do not match its operator (count, shape or dtype)."""
