"""How the command lines (`make demo`, `make next-day`) end on a setting to fix."""

from __future__ import annotations

from collections.abc import Callable

from gem_model.config import ConfigError


def run_main(main: Callable[[], None]) -> None:
    """main(); a ConfigError (a variable or spec to fix), also one Dagster wrapped while loading the code location,
    ends the command with its message alone: the traceback would only bury it."""
    try:
        main()
    except Exception as e:
        cause: BaseException | None = e
        while cause is not None and not isinstance(cause, ConfigError):
            cause = cause.__cause__
        if cause is None:
            raise
        raise SystemExit(f"error: {cause}") from None
