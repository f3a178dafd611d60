"""async def workflows and steps: async steps on an event loop (Django's async ORM inside), a timeout
that cancels an async step cleanly, async workflows in-process and in a real worker, astart() and
await_result() from async code."""

import asyncio

import pytest
from asgiref.sync import sync_to_async
from django.db import connections

import django_durable as durable
from django_durable.models import Step, WorkflowRun
from django_durable.testing import drain
from tests.conftest import assert_settled, ledger_counts
from tests.testapp.models import Payment

pytestmark = pytest.mark.django_db(transaction=True)


def test_an_async_workflow_awaits_async_steps_and_replays_them():
    run = durable.start("tests.async_flow", amount=9)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "waiting"
    durable.signal(run.pk, "go")
    drain()  # replays fetch and pay from the journal
    run = WorkflowRun.objects.get(pk=run.pk)
    assert (run.status, run.get_result()) == ("completed", ["fetched fetch", 9])
    assert ledger_counts(run.pk) == {"fetch": 1, "after": 1}
    assert Payment.objects.filter(run_id=run.pk).count() == 1
    assert durable.describe("tests.async_flow")["shape"][:2] == [
        {"type": "step", "key": "fetch", "function": "tests.testapp.workflows.fetch_async"},
        {"type": "step", "key": "pay", "function": "tests.testapp.workflows.pay_async"}]


def test_an_async_steps_timeout_cancels_it_cleanly():
    run = durable.start("tests.async_timeout", seconds=30)
    drain()
    run = WorkflowRun.objects.get(pk=run.pk)
    assert run.status == "failed"
    step = Step.objects.get(run=run, key="slow")
    assert step.status == "failed" and "StepTimeout" in step.error
    assert ledger_counts(run.pk) == {"slow-started": 1, "slow-cleaned-up": 1}  # its finally ran


def test_an_async_workflow_that_awaits_io_in_its_own_code_fails_saying_why():
    run = durable.start("tests.async_awaits_io")
    drain()
    run = WorkflowRun.objects.get(pk=run.pk)
    assert run.status == "failed" and "do I/O, asyncio.sleep() and other awaits inside a step" in \
        run.get_error()["message"]


def test_an_async_step_cannot_be_atomic():
    async def write():
        return 1

    @durable.workflow("tests.async.atomic")
    def atomic_async(ctx):
        return ctx.step("w", write, atomic=True)

    run = durable.start(atomic_async)
    drain()
    run = WorkflowRun.objects.get(pk=run.pk)
    assert run.status == "failed" and "cannot be an atomic step" in run.get_error()["message"]


@pytest.mark.every_django
@pytest.mark.timeout(120)
def test_astart_and_await_result_with_a_real_worker(start_worker):
    start_worker(burst=False)

    async def main():
        run = await durable.astart("tests.async_flow", amount=3)
        with pytest.raises(durable.WaitTimeout):
            await durable.await_result(run.pk, timeout=0.5)  # waiting for "go"
        await sync_to_async(durable.signal)(run.pk, "go")
        result = await durable.await_result(run.pk, timeout=60)
        # Outside a request nobody closes the connection astart() opened on Django's sync thread.
        await sync_to_async(connections.close_all)()
        return run.pk, result

    pk, result = asyncio.run(main())
    assert result == ["fetched fetch", 3]
    assert ledger_counts(pk) == {"fetch": 1, "after": 1}
    assert Payment.objects.get(run_id=pk).amount == 3
    assert_settled()
