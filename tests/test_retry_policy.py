"""RetryPolicy arithmetic and validation, without a database."""

import datetime as dt

import pytest
from django.core.exceptions import ImproperlyConfigured

import django_durable as durable
from django_durable.retry import DEFAULT, from_setting


def test_backoff_grows_by_the_coefficient_up_to_the_cap():
    policy = durable.RetryPolicy(max_attempts=10, initial_backoff=1, backoff_coefficient=2, max_backoff=10, jitter=0)
    assert [policy.backoff(n) for n in range(1, 7)] == [1, 2, 4, 8, 10, 10]


def test_jitter_spreads_the_backoff_within_its_fraction():
    policy = durable.RetryPolicy(initial_backoff=10, jitter=0.2, max_backoff=100)
    delays = {round(policy.backoff(1), 6) for _ in range(200)}
    assert len(delays) > 50
    assert all(8 <= d <= 12 for d in delays)


def test_timedeltas_are_accepted():
    policy = durable.RetryPolicy(initial_backoff=dt.timedelta(minutes=1), max_backoff=dt.timedelta(hours=1), jitter=0)
    assert policy.backoff(1) == 60 and policy.max_backoff == 3600


def test_attempts_and_exception_types_decide_whether_to_retry():
    policy = durable.RetryPolicy(max_attempts=3, non_retryable=(KeyError,))
    assert policy.retries(ValueError(), 1) and policy.retries(ValueError(), 2)
    assert not policy.retries(ValueError(), 3)
    assert not policy.retries(KeyError(), 1)
    assert not policy.retries(durable.NonRetryableError("no"), 1)
    assert not policy.retries(durable.NotSerializable("no"), 1)
    assert policy.retries(durable.RetryAfter(5), 1)


def test_retry_after_sets_the_delay():
    policy = durable.RetryPolicy(initial_backoff=1, jitter=0)
    assert policy.delay(durable.RetryAfter(5), 1) == 5
    assert policy.delay(durable.RetryAfter(dt.timedelta(minutes=2)), 1) == 120
    assert policy.delay(ValueError(), 1) == 1


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"max_attempts": 0}, "max_attempts must be an integer >= 1, not 0"),
        ({"max_attempts": 2.5}, "max_attempts"),
        ({"initial_backoff": -1}, "initial_backoff must be a number of seconds"),
        ({"backoff_coefficient": 0.5}, "backoff_coefficient must be a number >= 1, not 0.5"),
        ({"jitter": 1.5}, "jitter must be a fraction in [0, 1), not 1.5"),
        ({"non_retryable": ("KeyError",)}, "non_retryable must hold exception types, not 'KeyError'"),
    ],
)
def test_bad_policies_are_refused_naming_the_value(kwargs, message):
    with pytest.raises(ValueError) as info:
        durable.RetryPolicy(**kwargs)
    assert message in str(info.value)


def test_retry_after_needs_a_number():
    with pytest.raises(ValueError, match="not 'soon'"):
        durable.RetryAfter("soon")


def test_the_project_setting_may_be_a_policy_or_a_dict():
    assert from_setting(None) is DEFAULT
    policy = durable.RetryPolicy(max_attempts=7)
    assert from_setting(policy) is policy
    assert from_setting({"max_attempts": 2}).max_attempts == 2
    with pytest.raises(ImproperlyConfigured, match="DURABLE_DEFAULT_RETRY"):
        from_setting({"attempts": 2})
    with pytest.raises(ImproperlyConfigured, match="DURABLE_DEFAULT_RETRY must be"):
        from_setting(3)


@pytest.mark.parametrize("bad", [-1, float("nan"), float("inf"), True, "5", dt.timedelta(seconds=-1)])
def test_every_duration_refuses_what_is_not_a_finite_number_of_seconds(bad):
    """One rule for back-offs, RetryAfter, timeouts, delays and sleeps: clock.seconds()."""
    for make in (lambda: durable.RetryPolicy(max_backoff=bad), lambda: durable.RetryAfter(bad)):
        with pytest.raises(ValueError, match="must be a number of seconds or a timedelta >= 0"):
            make()
    assert durable.RetryAfter(dt.timedelta(minutes=1)).seconds == 60.0
