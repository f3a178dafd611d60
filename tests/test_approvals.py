"""Human approval gated by Django permissions: who may decide, a quorum of different users, the
admin's inbox, e-mailed links (forged, expired, reused, another user's), the REST API, and every
decision in the run's audit trail with its user."""

import pytest
from django.contrib.auth.models import Group, Permission
from django.core.exceptions import PermissionDenied
from rest_framework.test import APIClient

import django_durable as durable
from django_durable.models import Approval, WorkflowEvent, WorkflowRun
from django_durable import approvers
from django_durable.services import approvals
from django_durable.testing import clock, drain
from tests.conftest import ledger_counts

pytestmark = pytest.mark.django_db(transaction=True)

INBOX = "/admin/django_durable/approval/"


@pytest.fixture
def people(django_user_model):
    permission = Permission.objects.get(codename="approve_refund", content_type__app_label="testapp")
    made = {}
    for name, approver in (("alice", True), ("carol", True), ("bob", False)):
        user = django_user_model.objects.create_user(name, f"{name}@example.com", "a-long-password", is_staff=True)
        if approver:
            user.user_permissions.add(permission)
        made[name] = django_user_model.objects.get(pk=user.pk)  # no cached permissions
    return made


def waiting(**kwargs):
    run = durable.start("tests.refund_approval", 25, **kwargs)
    drain()
    assert WorkflowRun.objects.get(pk=run.pk).status == "waiting"
    return run


def result(run):
    drain()
    run = WorkflowRun.objects.get(pk=run.pk)
    return run.status, run.get_result()


def test_an_approver_with_the_permission_decides_and_the_run_goes_on(people):
    run = waiting()
    approval = Approval.objects.get(run=run)
    assert (approval.key, approval.permission, approval.message, approval.data) == (
        "refund", "testapp.approve_refund", "Refund 25 EUR?", {"amount": 25})
    assert WorkflowRun.objects.get(pk=run.pk).waiting_on.startswith("approval 'refund'")
    with pytest.raises(PermissionDenied):
        durable.decide(run.pk, "refund", people["bob"], approve=True)
    assert [a.pk for a in durable.approvals_for(people["alice"])] == [approval.pk]
    assert durable.approvals_for(people["bob"]) == []
    durable.decide(run.pk, "refund", people["alice"], approve=True, comment="fine")
    assert durable.approvals_for(people["alice"]) == []
    status, decision = result(run)
    assert status == "completed"
    assert decision == {"approved": True, "by": ["alice"],
                        "decisions": [{"user": "alice", "approved": True, "comment": "fine"}]}
    trail = WorkflowEvent.objects.get(run=run, type="approved")
    assert (trail.actor, trail.message, trail.data["settled"]) == ("alice", "fine", True)
    assert ledger_counts(run.pk) == {"after": 1}


def test_two_person_approval_needs_two_different_users(people):
    run = waiting(quorum=2)
    durable.decide(run.pk, "refund", people["alice"], approve=True)
    assert result(run)[0] == "waiting"  # one of two
    with pytest.raises(durable.InvalidTransition, match="already decided"):
        durable.decide(run.pk, "refund", people["alice"], approve=True)
    durable.decide(run.pk, "refund", people["carol"], approve=True)
    status, decision = result(run)
    assert (status, decision["by"]) == ("completed", ["alice", "carol"])
    assert list(WorkflowEvent.objects.filter(run=run, type="approved").values_list("actor", flat=True)) == [
        "alice", "carol"]
    with pytest.raises(durable.InvalidTransition):
        durable.decide(run.pk, "refund", people["carol"], approve=False)  # settled: nobody decides again


def test_one_rejection_rejects(people):
    run = waiting(quorum=2)
    durable.decide(run.pk, "refund", people["alice"], approve=False, comment="too much")
    status, decision = result(run)
    assert (status, decision["approved"], decision["by"]) == ("completed", False, ["alice"])
    assert Approval.objects.get(run=run).status == "rejected"


def test_approvers_as_a_group_or_a_list_of_users(people):
    finance = Group.objects.create(name="finance")
    people["bob"].groups.add(finance)
    by_group = waiting(approvers={"group": "finance"})
    by_list = waiting(approvers=[people["carol"].pk])
    with pytest.raises(PermissionDenied):
        durable.decide(by_group.pk, "refund", people["alice"], approve=True)  # the permission is not the group
    with pytest.raises(PermissionDenied):
        durable.decide(by_list.pk, "refund", people["alice"], approve=True)
    durable.decide(by_group.pk, "refund", people["bob"], approve=True)
    durable.decide(by_list.pk, "refund", people["carol"], approve=True)
    assert result(by_group)[1]["by"] == ["bob"] and result(by_list)[1]["by"] == ["carol"]


def test_bad_approvers_are_refused_when_the_run_reaches_the_wait():
    run = durable.start("tests.refund_approval", 25, approvers="not a permission")
    drain()
    run = WorkflowRun.objects.get(pk=run.pk)
    assert run.status == "failed" and "app_label.codename" in run.get_error()["message"]


def test_a_timed_out_approval_ends_the_wait_and_can_no_longer_be_decided(people):
    with clock() as test_clock:
        run = waiting(timeout=3600)
        test_clock.advance(seconds=3601)
        assert durable.approvals_for(people["alice"]) == []
        with pytest.raises(durable.InvalidTransition, match="expired"):
            durable.decide(run.pk, "refund", people["alice"], approve=True)
        assert result(run) == ("completed", {"approved": None})


def test_the_inbox_lists_and_decides_what_the_user_may_decide(client, people):
    run = waiting()
    client.force_login(people["bob"])
    assert "Nothing waits for your decision." in client.get(INBOX).content.decode()
    assert client.get(f"{INBOX}{Approval.objects.get(run=run).pk}/").status_code == 403  # nor an operator
    client.force_login(people["alice"])
    inbox = client.get(INBOX).content.decode()
    assert "Refund 25 EUR?" in inbox
    page = client.get(f"{INBOX}{Approval.objects.get(run=run).pk}/").content.decode()
    assert "&quot;amount&quot;: 25" in page and 'id="durable-decide"' in page
    response = client.post(f"{INBOX}{Approval.objects.get(run=run).pk}/", {"decision": "approve", "comment": "ok"})
    assert response.status_code == 302 and response["Location"] == INBOX
    assert result(run)[1]["by"] == ["alice"]


def test_an_emailed_link_needs_a_logged_in_approver_and_decides_once(client, people, settings):
    run = waiting()
    link = durable.approval_link(run.pk, "refund")
    assert link.startswith(f"{INBOX}link/")
    assert client.get(link).status_code == 302  # not logged in: to the login page
    client.force_login(people["bob"])
    assert client.get(link).status_code == 403
    assert client.post(link, {"decision": "approve"}).status_code == 403
    assert Approval.objects.get(run=run).status == "pending"  # bob may not, link or not
    client.force_login(people["alice"])
    forged = link[:-6] + ("aaaaa/" if not link.endswith("aaaaa/") else "bbbbb/")
    refused = client.get(forged)
    assert refused.status_code == 400 and "This approval link is not valid." in refused.content.decode()
    assert client.post(link, {"decision": "approve", "comment": "via e-mail"}).status_code == 302
    assert WorkflowEvent.objects.get(run=run, type="approved").data["by_link"] is True
    reused = client.get(link)
    assert reused.status_code == 400 and "already used" in reused.content.decode()
    settings.DURABLE_APPROVAL_LINK_MAX_AGE = 0
    other = waiting()
    expired = client.get(durable.approval_link(other.pk, "refund"))
    assert expired.status_code == 400 and "has expired" in expired.content.decode()
    settings.DURABLE_APPROVAL_LINK_MAX_AGE = 3600
    for_carol = durable.approval_link(other.pk, "refund", user=people["carol"])
    assert "sent to another user" in client.get(for_carol).content.decode()


def test_the_rest_api_lists_and_decides(people):
    run = waiting()
    alice, bob = APIClient(), APIClient()
    alice.force_authenticate(people["alice"])
    bob.force_authenticate(people["bob"])
    listed = alice.get("/api/durable/approvals/").json()
    assert [(a["run"], a["key"], a["data"], a["quorum"]) for a in listed] == [(str(run.pk), "refund", {"amount": 25}, 1)]
    assert bob.get("/api/durable/approvals/").json() == []
    url = f"/api/durable/workflows/{run.pk}/approvals/refund/"
    assert bob.post(url, {"approve": True}, format="json").status_code == 403
    assert alice.post(f"/api/durable/workflows/{run.pk}/approvals/other/", {"approve": True},
                      format="json").status_code == 404
    assert alice.post(url, {"approve": "maybe"}, format="json").status_code == 400
    decided = alice.post(url, {"approve": True, "comment": "ok"}, format="json")
    assert decided.status_code == 200 and decided.json()["status"] == "approved"
    again = alice.post(url, {"approve": True}, format="json")
    assert again.status_code == 409 and again.json()["error"]["code"] == "invalid_transition"
    assert result(run)[1]["by"] == ["alice"]


def test_a_signal_cannot_forge_an_approval(people):
    run = waiting()
    durable.signal(run.pk, "refund", {"approved": True, "by": ["mallory"]})
    assert result(run)[0] == "waiting"


@durable.workflow("tests.approvals.two_people")
def two_people(ctx):
    return ctx.wait_for_approval("payout", approvers={"group": "finance"}, quorum=2)


def test_describe_shows_the_approval():
    assert durable.describe(two_people)["shape"] == [
        {"type": "approval", "key": "payout", "approvers": "group finance", "quorum": 2}]
    # The workflow's arguments with defaults take them; given, the input's.
    assert durable.describe("tests.refund_approval")["shape"][0] == {
        "type": "approval", "key": "refund", "approvers": "permission testapp.approve_refund", "quorum": 1}
    assert durable.describe("tests.refund_approval", quorum=2, timeout=60)["shape"][0] == {
        "type": "approval", "key": "refund", "approvers": "permission testapp.approve_refund", "quorum": 2,
        "timeout": 60.0}

    # Approvers known only at run time (from data) show as "?".
    @durable.workflow("tests.approvals.from_data")
    def from_data(ctx, who, how_many, hours):
        return ctx.wait_for_approval("refund", approvers=who, quorum=how_many, timeout=hours)

    assert durable.describe(from_data)["shape"][0] == {
        "type": "approval", "key": "refund", "approvers": "?", "quorum": "?", "timeout": True}


def test_approvers_are_parsed_once_and_refused_clearly():
    assert approvers.approvers_spec("a.b") == {"permission": "a.b"}
    assert approvers.approvers_spec({"users": [3, "4"]}) == {"users": ["3", "4"]}
    for bad in ("nodot", [], {"group": ""}, 42, {"permission": "a.b", "group": "x"}):
        with pytest.raises(ValueError):
            approvers.approvers_spec(bad)
