"""durable/metrics/: the Prometheus text format, scraped and parsed, against runs in known states;
who may scrape it."""

import pytest

import django_durable as durable
from django_durable.models import Step, Worker
from django_durable.testing import drain

pytestmark = [pytest.mark.django_db(transaction=True), pytest.mark.urls("tests.urls")]

parser = pytest.importorskip("prometheus_client.parser", reason="prometheus-client is not installed")

URL = "/durable/metrics/"


def scrape(client, **headers) -> dict:
    response = client.get(URL, **headers)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain")
    samples = {}
    for family in parser.text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def test_the_metrics_count_runs_queues_steps_and_workers(admin_client):
    from django.utils import timezone

    durable.start("tests.approval")               # will wait for a signal
    durable.start("tests.three_steps", x=1)       # will complete: three steps
    durable.start("tests.raises")                 # will fail
    durable.start("tests.always_failing", backoff=600, queue="retries")  # will wait out a step's back-off
    drain()
    durable.start("tests.three_steps", queue="slow")  # ready, not taken: the slow queue's lag
    Worker.objects.create(name="web-1:7", host="web-1", pid=7, started_at=timezone.now(), last_seen=timezone.now(),
                          processed=41)
    Step.objects.filter(key="b").update(attempts=3)  # as if b had been tried three times
    samples = scrape(admin_client)
    assert samples[("durable_runs", (("queue", "default"), ("status", "waiting")))] == 1
    assert samples[("durable_runs", (("queue", "slow"), ("status", "pending")))] == 1
    assert samples[("durable_runs_finished", (("outcome", "completed"), ("queue", "default")))] == 1
    assert samples[("durable_runs_finished", (("outcome", "failed"), ("queue", "default")))] == 1
    assert samples[("durable_queue_ready", (("queue", "slow"),))] == 1
    assert samples[("durable_queue_lag_seconds", (("queue", "slow"),))] >= 0
    count = samples[("durable_step_duration_seconds_count", (("workflow", "tests.three_steps"),))]
    assert count == 3
    assert samples[("durable_step_duration_seconds_bucket", (("le", "+Inf"), ("workflow", "tests.three_steps")))] == 3
    assert samples[("durable_step_retries", (("workflow", "tests.three_steps"),))] == 2
    assert samples[("durable_worker_items_processed_total", (("worker", "web-1:7"),))] == 41
    assert samples[("durable_workers_live", ())] == 1
    assert samples[("durable_expired_claims", ())] == 0
    assert samples[("durable_steps_retrying", ())] == 1


def test_only_users_who_may_view_runs_or_the_token_may_scrape(client, settings, django_user_model):
    assert client.get(URL).status_code == 401  # who are you? (WWW-Authenticate: Bearer)
    settings.DURABLE_METRICS_TOKEN = "s3cret-scrape-token"
    assert client.get(URL, HTTP_AUTHORIZATION="Bearer wrong").status_code == 401
    assert ("durable_workers_live", ()) in scrape(client, HTTP_AUTHORIZATION="Bearer s3cret-scrape-token")
    clerk = django_user_model.objects.create_user("clerk", password="a-long-password", is_staff=True)
    client.force_login(clerk)
    assert client.get(URL).status_code == 403  # staff, but may not view runs
