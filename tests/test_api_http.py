"""The REST API over real HTTP against a live server: the flow a front end uses, with a real
worker, and a schemathesis run that looks for 500s and responses the schema does not describe."""

import os

import pytest
from hypothesis import HealthCheck, settings

import django_durable as durable

pytestmark = pytest.mark.django_db(transaction=True)

httpx = pytest.importorskip("httpx")
schemathesis = pytest.importorskip("schemathesis")


@pytest.fixture
def operator(django_user_model):
    django_user_model.objects.create_superuser("ops", "ops@example.com", "ops-password")
    return ("ops", "ops-password")


@pytest.mark.every_django
def test_a_front_end_starts_polls_signals_and_cancels(live_server, start_worker, operator):
    worker = start_worker(burst=False)
    with httpx.Client(base_url=f"{live_server.url}/api/durable", auth=operator, timeout=30) as http:
        started = http.post("/workflows/", json={"workflow": "tests.three_steps", "kwargs": {"x": 5}})
        assert started.status_code == 201, started.text
        run_id = started.json()["id"]
        result = http.get(f"/workflows/{run_id}/result/", params={"wait": 20})
        assert result.status_code == 200 and result.json()["result"] == [5, 6, 7]
        status = http.get(f"/workflows/{run_id}/").json()
        assert (status["status"], status["steps"]) == ("completed", {"completed": 3})

        approval = http.post("/workflows/", json={"workflow": "tests.approval"}).json()["id"]
        sent = http.post(f"/workflows/{approval}/signals/approved/", json={"payload": {"by": "front end"}})
        assert sent.status_code == 202
        assert http.get(f"/workflows/{approval}/result/", params={"wait": 20}).json()["result"] == {"by": "front end"}

        doomed = http.post("/workflows/", json={"workflow": "tests.approval"}).json()["id"]
        cancelled = http.delete(f"/workflows/{doomed}/", params={"reason": "user closed the tab"})
        # Cancelled at once if it waits; if the worker holds it at that moment, it ends cancelled
        # when the worker lets go (a race this test does not control).
        assert cancelled.status_code == 202, cancelled.text
        assert cancelled.json()["status"] == "cancelled" or cancelled.json()["cancel_requested"], cancelled.text
        ended = http.get(f"/workflows/{doomed}/result/", params={"wait": 20}).json()
        assert ended["status"] == "cancelled" and ended["error"]["message"] == "user closed the tab"
        assert http.delete(f"/workflows/{doomed}/").status_code == 202  # again: still fine
        assert http.get("/workflows/not-a-uuid/").status_code == 404
        anonymous = httpx.get(f"{live_server.url}/api/durable/workflows/")
        assert anonymous.status_code == 401 and anonymous.json()["error"]["code"] == "not_authenticated"
        assert anonymous.headers["WWW-Authenticate"] == 'Basic realm="api"'  # DRF's defaults: a session, then Basic
    assert worker.running(), worker.log()


@pytest.fixture
def api_schema(live_server, operator, settings):
    settings.DURABLE_API_THROTTLE_RATES = None  # the fuzzer sends hundreds of requests
    settings.DURABLE_API_MAX_WAIT = 0.2
    settings.DURABLE_STREAM_MAX_SECONDS = 0.3  # a waiting run's events end soon
    from django_durable import schedules
    from django_durable.testing import drain

    schedules.ensure_schedule("hourly", "tests.tick", cron="0 * * * *")
    for workflow, kwargs in (("tests.approval", {}), ("tests.three_steps", {"x": 1}), ("tests.raises", {}),
                             ("tests.sleeper", {"seconds": 3600})):
        durable.start(workflow, **kwargs)
    drain()
    schema = schemathesis.openapi.from_url(f"{live_server.url}/api/durable/schema/?format=json", auth=operator)
    schema.config.update(base_url=f"{live_server.url}/api/durable")
    return schema


def test_the_api_never_answers_500_and_keeps_to_its_schema(api_schema, operator):
    """Every operation of the schema, fuzzed by hypothesis, against the live server.

    (schemathesis' own pytest plugin does not run on pytest 9, so each operation's strategy is
    driven here.)
    """
    from hypothesis import given
    from schemathesis.checks import not_a_server_error
    from schemathesis.specs.openapi.checks import response_schema_conformance, status_code_conformance

    from hypothesis import strategies as st

    from django_durable.models import WorkflowRun

    operations = [result.ok() for result in api_schema.get_all_operations()]
    assert len(operations) == 27
    # Random UUIDs and slugs only ever find nothing: most cases aim at real runs and schedules.
    runs = [str(pk) for pk in WorkflowRun.objects.values_list("pk", flat=True)]
    calls = []
    for operation in operations:

        @given(case=operation.as_strategy(), pick=st.integers(0, len(runs)))
        # CI replays a fixed set of cases (a gate); elsewhere each run explores new ones, and
        # DURABLE_FUZZ_EXAMPLES=1000 explores longer.
        @settings(max_examples=int(os.environ.get("DURABLE_FUZZ_EXAMPLES", 30)), derandomize=bool(os.environ.get("CI")),
                  deadline=None, suppress_health_check=list(HealthCheck), database=None)
        def check(case, pick):
            if "id" in (case.path_parameters or {}) and pick < len(runs):
                case.path_parameters["id"] = runs[pick]
            if "slug" in (case.path_parameters or {}) and pick < len(runs):
                case.path_parameters["slug"] = "hourly"
            response = case.call(auth=operator)
            calls.append(response.status_code)
            case.validate_response(response, checks=[not_a_server_error, response_schema_conformance,
                                                     status_code_conformance])

        check()
    assert len(calls) >= 12 * 10 and 500 not in calls
