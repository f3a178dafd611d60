"""django_durable.testing: drain() runs workflows inside an ordinary (transactional) test."""

import pytest

import django_durable as durable
from django_durable.models import WorkflowRun
from django_durable.testing import drain


@pytest.mark.django_db
def test_drain_runs_a_workflow_inside_the_tests_transaction():
    run = durable.start("tests.three_steps", x=2)
    assert drain() == 1
    run.refresh_from_db()
    assert run.status == "completed"
    assert run.get_result() == [2, 3, 4]
    assert drain() == 0


@pytest.mark.django_db
def test_drain_respects_queues():
    durable.start("tests.three_steps", queue="reports")
    assert drain(queues=["default"]) == 0
    assert drain(queues=["reports"]) == 1
    assert WorkflowRun.objects.get().status == "completed"
