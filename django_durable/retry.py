"""Retry policies: how often a failing step is tried again, and how long to wait in between."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import Any

from django.core.exceptions import ImproperlyConfigured

from . import clock
from .exceptions import NonRetryableError, NotSerializable, PayloadTooLarge, RetryAfter


@dataclass(frozen=True)
class RetryPolicy:
    """When a step raises, try it again up to `max_attempts` times in all.

    The wait before attempt n+1 is ``initial_backoff * backoff_coefficient ** (n - 1)`` seconds,
    at most `max_backoff`, spread by ±`jitter` (a fraction) so that failures do not retry in
    lockstep. Exceptions of the `non_retryable` types, and NonRetryableError, are not retried;
    RetryAfter sets the next wait itself.

    `on_exhausted` says what a step's failure for good does: "fail" (StepFailed is raised in the
    workflow, which may catch it) or "pause" (the run is held ``paused`` for an operator, its
    journal, waits and children kept, until it is resumed, the step then tried again with fresh
    attempts, or failed on purpose). A NonRetryableError fails the step either way: the code asked
    for it.
    """

    max_attempts: int = 3
    initial_backoff: float = 1.0
    backoff_coefficient: float = 2.0
    max_backoff: float = 60.0
    jitter: float = 0.1
    non_retryable: tuple[type[BaseException], ...] = field(default=())
    on_exhausted: str = "fail"

    def __post_init__(self):
        if isinstance(self.max_attempts, bool) or not isinstance(self.max_attempts, int) or self.max_attempts < 1:
            raise ValueError(f"RetryPolicy max_attempts must be an integer >= 1, not {self.max_attempts!r}.")
        object.__setattr__(self, "initial_backoff", clock.seconds(self.initial_backoff, "RetryPolicy initial_backoff"))
        object.__setattr__(self, "max_backoff", clock.seconds(self.max_backoff, "RetryPolicy max_backoff"))
        coefficient = self.backoff_coefficient
        if isinstance(coefficient, bool) or not isinstance(coefficient, (int, float)) or coefficient < 1:
            raise ValueError(f"RetryPolicy backoff_coefficient must be a number >= 1, not {coefficient!r}.")
        if isinstance(self.jitter, bool) or not isinstance(self.jitter, (int, float)) or not 0 <= self.jitter < 1:
            raise ValueError(f"RetryPolicy jitter must be a fraction in [0, 1), not {self.jitter!r}.")
        types = self.non_retryable
        if isinstance(types, type):
            types = (types,)
        types = tuple(types)
        for kind in types:
            if not (isinstance(kind, type) and issubclass(kind, BaseException)):
                raise ValueError(f"RetryPolicy non_retryable must hold exception types, not {kind!r}.")
        object.__setattr__(self, "non_retryable", types)
        if self.on_exhausted not in ("fail", "pause"):
            raise ValueError(f"RetryPolicy on_exhausted must be 'fail' or 'pause', not {self.on_exhausted!r}.")

    def backoff(self, attempt: int) -> float:
        """Return the seconds to wait after failed attempt number `attempt` (1-based), jittered."""
        base = min(self.max_backoff, self.initial_backoff * self.backoff_coefficient ** (attempt - 1))
        if self.jitter:
            base *= random.uniform(1 - self.jitter, 1 + self.jitter)
        return min(base, self.max_backoff)

    def retries(self, exc: BaseException, attempt: int) -> bool:
        """Return True if a step that raised `exc` on attempt `attempt` should be tried again."""
        if attempt >= self.max_attempts:
            return False
        if isinstance(exc, (NonRetryableError, NotSerializable, PayloadTooLarge)):
            return False
        return not isinstance(exc, self.non_retryable)

    def pauses(self, exc: BaseException) -> bool:
        """Return True if a step that failed for good with `exc` holds its run for an operator."""
        return self.on_exhausted == "pause" and not isinstance(exc, NonRetryableError)

    def delay(self, exc: BaseException, attempt: int) -> float:
        """Return the seconds to wait before the next attempt after `exc`."""
        if isinstance(exc, RetryAfter):
            return exc.seconds
        return self.backoff(attempt)


DEFAULT = RetryPolicy()
NO_RETRY = RetryPolicy(max_attempts=1)


def from_setting(value: Any) -> RetryPolicy:
    """Return the RetryPolicy that DURABLE_DEFAULT_RETRY describes (a policy or a dict of its fields)."""
    if value is None:
        return DEFAULT
    if isinstance(value, RetryPolicy):
        return value
    if isinstance(value, dict):
        try:
            return RetryPolicy(**value)
        except (TypeError, ValueError) as exc:
            raise ImproperlyConfigured(f"DURABLE_DEFAULT_RETRY is not a valid retry policy: {exc}") from None
    raise ImproperlyConfigured(
        f"DURABLE_DEFAULT_RETRY must be a durable.RetryPolicy or a dict of its fields, not {value!r}."
    )
