"""Human approval gated by Django's users and permissions (``ctx.wait_for_approval()``).

A run that reaches ``ctx.wait_for_approval(key, approvers=...)`` stores an Approval (who may
decide, how many must approve, what they are asked) and waits. A person decides from the admin's
approval inbox, an e-mailed link, the REST API or ``durable.decide()``; each decision is checked
against the approval's approvers, recorded with its user in the run's audit trail, and the
decision that settles it (the quorum's last approval, or any rejection) sends the run an
"approval" message in the same transaction. The run's wait takes that message like a signal's,
once. Nothing else can forge one: ``durable.signal()`` sends only signals.
"""

from __future__ import annotations

import secrets

from django.core import signing
from django.core.exceptions import PermissionDenied
from django.db import IntegrityError, transaction
from django.db.models import Q
from django.urls import reverse

from .. import clock, conf, serialization, workpool
from ..exceptions import DurableError, InvalidTransition
from ..models import Approval, ApprovalDecision, SignalMessage, WorkflowEvent, WorkflowRun
from .locks import lock_unfinished
from ..ids import run_pk

_SALT = "django_durable.approval-link"


class ApprovalNotFound(DurableError, LookupError):
    """No run waits for an approval under that key (or it never reached the wait)."""


class InvalidLink(DurableError, ValueError):
    """An approval link that was forged, has expired or was already used."""


def may_decide(user, approval: Approval, groups: set[str] | None = None) -> bool:
    """Whether `user` is one of `approval`'s approvers (an active, logged-in user); `groups`, the
    names of the user's groups when the caller read them already."""
    if user is None or not getattr(user, "is_authenticated", False) or not user.is_active:
        return False
    if approval.permission:
        return user.has_perm(approval.permission)
    if approval.group:
        return approval.group in groups if groups is not None else user.groups.filter(name=approval.group).exists()
    return str(user.pk) in approval.users


def approvals_for(user, db: str | None = None) -> list[Approval]:
    """The approvals `user` may decide now and has not: pending, not expired, their run unfinished."""
    db = db or conf.get("DATABASE")
    if user is None or not getattr(user, "is_authenticated", False):
        return []
    now = clock.db_now()
    candidates = (
        Approval.objects.using(db).filter(status=Approval.Status.PENDING)
        .filter(Q(deadline_at__isnull=True) | Q(deadline_at__gt=now))
        .exclude(run__status__in=WorkflowRun.TERMINAL)
        .exclude(decisions__user_id=user.pk)
        .select_related("run").prefetch_related("decisions").order_by("created_at", "id")
    )
    groups = set(user.groups.values_list("name", flat=True))  # once, not a query per approval
    return [approval for approval in candidates if may_decide(user, approval, groups)]


def decide(run_id, key: str, user, *, approve: bool, comment: str = "", link: str | None = None) -> Approval:
    """Record `user`'s decision on the approval `key` of run `run_id`; return the approval.

    Raise ApprovalNotFound, PermissionDenied if the user is not one of its approvers,
    InvalidTransition if it is already settled, has expired, its run ended or the user already
    decided, InvalidLink if `link` (the nonce of an e-mailed link) was used before.
    """
    pk = run_pk(run_id)
    db = conf.get("DATABASE")
    comment = str(comment or "")[:4000]
    with transaction.atomic(using=db):
        # The workers' lock order (the run's item, then the run), then the approval.
        try:
            lock_unfinished(pk, db)
        except DurableError as exc:
            if not Approval.objects.using(db).filter(run_id=pk, key=key).exists():
                raise ApprovalNotFound(f"Run {pk} waits for no approval {key!r}.") from exc
            raise InvalidTransition(f"Run {pk} has ended; its approval {key!r} can no longer be decided.") from exc
        approval = Approval.objects.using(db).select_for_update().filter(run_id=pk, key=key).first()
        if approval is None:
            raise ApprovalNotFound(f"Run {pk} waits for no approval {key!r}.")
        if not may_decide(user, approval):
            raise PermissionDenied(f"You may not decide the approval {key!r} of run {pk}: it is for "
                                   f"{approval.approvers}.")
        if approval.status != Approval.Status.PENDING:
            raise InvalidTransition(f"The approval {key!r} of run {pk} is already {approval.status}.")
        if approval.deadline_at is not None and Approval.objects.using(db).filter(
                pk=approval.pk, deadline_at__lte=clock.db_now()).exists():
            raise InvalidTransition(f"The approval {key!r} of run {pk} expired at {approval.deadline_at:%Y-%m-%d %H:%M} UTC.")
        if ApprovalDecision.objects.using(db).filter(approval=approval, user_id=user.pk).exists():
            raise InvalidTransition(f"You already decided the approval {key!r} of run {pk}; a quorum "
                                    f"needs different people.")
        try:
            with transaction.atomic(using=db):
                ApprovalDecision.objects.using(db).create(
                    approval=approval, user_id=user.pk, username=user.get_username(), approved=bool(approve),
                    comment=comment, link=link)
        except IntegrityError as exc:
            raise InvalidLink("This approval link was already used.") from exc
        decisions = list(ApprovalDecision.objects.using(db).filter(approval=approval).order_by("at", "id"))
        approvals = sum(1 for decision in decisions if decision.approved)
        settled = not approve or approvals >= approval.quorum
        WorkflowEvent.record(pk, WorkflowEvent.Type.APPROVED if approve else WorkflowEvent.Type.REJECTED,
                             by=user.get_username(), message=comment,
                             data={"key": key, "approvals": approvals, "quorum": approval.quorum, "settled": settled,
                           **({"by_link": True} if link else {})}, db=db)
        if settled:
            Approval.objects.using(db).filter(pk=approval.pk).update(
                status=Approval.Status.APPROVED if approve else Approval.Status.REJECTED, decided_at=clock.db_now())
            approval.refresh_from_db(using=db)
            outcome = {
                "approved": bool(approve),
                "by": [d.username for d in decisions if d.approved == bool(approve)],
                "decisions": [{"user": d.username, "approved": d.approved, "comment": d.comment} for d in decisions],
            }
            SignalMessage.objects.using(db).create(
                run_id=pk, kind=SignalMessage.Kind.APPROVAL, name=key, target_key=key,
                payload=serialization.encode(outcome))
            workpool.wake([pk], db=db)
    return approval


def approval_link(run_id, key: str, *, user=None, request=None) -> str:
    """The URL of a signed link to the approval `key` of run `run_id`, to e-mail to its approvers.

    A page of the admin shows the approval and decides it. The link is absolute with `request`
    (``request.build_absolute_uri``), a path otherwise.

    It expires after DURABLE_APPROVAL_LINK_MAX_AGE and decides once; with `user`, only that
    user may use it. Following it still needs a logged-in user who may decide.
    """
    pk = run_pk(run_id)
    approval = Approval.objects.using(conf.get("DATABASE")).filter(run_id=pk, key=key).first()
    if approval is None:
        raise ApprovalNotFound(f"Run {pk} waits for no approval {key!r}.")
    token = signing.dumps({"a": approval.pk, "n": secrets.token_urlsafe(16),
                           "u": None if user is None else str(user.pk)}, salt=_SALT)
    path = reverse("admin:django_durable_approval_link", args=[token])
    return request.build_absolute_uri(path) if request is not None else path


def read_link(token: str, user) -> tuple[Approval, str]:
    """The approval an e-mailed link's token names and its nonce; raise InvalidLink."""
    try:
        data = signing.loads(token, salt=_SALT, max_age=conf.get("APPROVAL_LINK_MAX_AGE"))
    except signing.SignatureExpired:
        raise InvalidLink("This approval link has expired; ask for a new one or use the approval inbox.") from None
    except signing.BadSignature:
        raise InvalidLink("This approval link is not valid.") from None
    approval = Approval.objects.using(conf.get("DATABASE")).select_related("run").filter(pk=data.get("a")).first()
    if approval is None:
        raise InvalidLink("The approval this link was for no longer exists.")
    if data.get("u") is not None and str(getattr(user, "pk", "")) != data["u"]:
        raise InvalidLink("This approval link was sent to another user.")
    if ApprovalDecision.objects.using(conf.get("DATABASE")).filter(link=data["n"]).exists():
        raise InvalidLink("This approval link was already used.")
    return approval, data["n"]
