"""The exception every zshard failure raises."""


class ZShardError(RuntimeError):
    """A zshard call failed.

    ``code`` is the name of the status code (abseil's / gRPC's, e.g.
    ``"FAILED_PRECONDITION"``, ``"UNAVAILABLE"``); the message names the
    cause (the shard, the parameter or the input that was wrong).
    """

    def __init__(self, message: str, code: str = "UNKNOWN") -> None:
        super().__init__(message)
        self.code = code


def invalid_argument(message: str) -> ZShardError:
    return ZShardError(f"INVALID_ARGUMENT: {message}", "INVALID_ARGUMENT")


def failed_precondition(message: str) -> ZShardError:
    return ZShardError(f"FAILED_PRECONDITION: {message}",
                       "FAILED_PRECONDITION")
