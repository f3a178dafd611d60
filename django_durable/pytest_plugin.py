"""pytest fixtures for testing workflows, registered through the ``pytest11`` entry point.

- ``durable_clock``: the engine's clock, frozen at the start of the test; ``durable_clock.advance(days=1)``.
- ``durable_drain``: ``django_durable.testing.drain``, to run queued work in the test's process.

Both need database access (``@pytest.mark.django_db``) to be useful.
"""

import pytest


@pytest.fixture
def durable_clock():
    from django_durable.testing import clock

    with clock() as frozen:
        yield frozen


@pytest.fixture
def durable_drain():
    from django_durable.testing import drain

    return drain
