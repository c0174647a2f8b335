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


class RolledBack(ZShardError):
    """The cluster went back to an earlier step (a shard died and was
    replaced from a snapshot or a checkpoint): the engine has joined it
    again and is ready to train from ``step`` (``engine.global_steps``).
    What the training loop did since that step is undone on the servers:
    redo it from the batch of ``step`` (for the same bits as an undisturbed
    run, batches must be a function of the step and the rank)."""

    def __init__(self, step: int, message: str) -> None:
        super().__init__(message, "ABORTED")
        self.step = step


def invalid_argument(message: str) -> ZShardError:
    return ZShardError(f"INVALID_ARGUMENT: {message}", "INVALID_ARGUMENT")


def failed_precondition(message: str) -> ZShardError:
    return ZShardError(f"FAILED_PRECONDITION: {message}",
                       "FAILED_PRECONDITION")
