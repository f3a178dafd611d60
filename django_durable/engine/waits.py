"""Waiting without holding a worker: durable sleeps, signals and events."""

from __future__ import annotations

import datetime as dt
from typing import Any

from django.utils import timezone

from ..ids import check_name
from ..journal import as_datetime
from .. import clock, serialization
from ..exceptions import ApprovalTimeout, SignalTimeout
from ..interrupts import Suspend


_CALLS = {"sleep": "sleep", "signal": "wait_for_signal", "event": "wait_for_event", "approval": "wait_for_approval"}

# An update (durable.update()) is a signal of this name prefix to the run, {"id", "payload"}; its
# answer is the journal entry ANSWER_PREFIX + its id, {"answer": value} or {"rejected": reason}.
UPDATE_PREFIX = "update:"
ANSWER_PREFIX = "update-answer:"


class Update:
    """An update a run took with ctx.wait_for_update(): its `name`, `id` and `payload`, and a way
    to answer it (or refuse it) that is recorded once, however often the run replays."""

    def __init__(self, ctx, name: str, id: str, payload: Any):
        self._ctx, self.name, self.id, self.payload = ctx, name, id, payload

    def answer(self, value: Any = None) -> None:
        """Answer the update: durable.update() returns `value` (JSON)."""
        self._ctx._answer_update(self, {"answer": value})

    def reject(self, reason: str = "") -> None:
        """Refuse the update: durable.update() raises UpdateRejected with `reason`."""
        self._ctx._answer_update(self, {"rejected": str(reason)[:2000]})

    def __repr__(self) -> str:
        return f"<Update {self.name} {self.id}>"


class Waits:
    """The waiting half of Context: each wait is a journal entry, and a timer if it can end by time."""

    def sleep(self, key: str, duration: float | dt.timedelta) -> None:
        """Wait `duration` (seconds or a timedelta), durably: the run waits, the worker is freed.

        The wake-up time is recorded the first time, so a replay never sleeps again.
        """
        seconds = clock.seconds(duration, "A duration")
        self._wait(key, "sleep", key, until=lambda now: now + dt.timedelta(seconds=seconds))

    def sleep_until(self, key: str, when: dt.datetime) -> None:
        """Wait until `when` (an aware datetime), durably."""
        if not isinstance(when, dt.datetime) or timezone.is_naive(when):
            raise ValueError(f"sleep_until needs an aware datetime, not {when!r}.")
        self._wait(key, "sleep", key, until=lambda now: when)

    def wait_for_signal(self, name: str, timeout: float | dt.timedelta | None = None, *, key: str | None = None) -> Any:
        """Return the payload of the next signal `name` sent to this run (FIFO), waiting for one.

        Signals sent before the wait are kept and returned in order, one per wait. Raise
        SignalTimeout if `timeout` passes first. Keyed `signal:<name>:<n>` by call order unless
        `key` is given.
        """

        check_name(name, "signal")
        key = key or self._auto_key("signal", name)
        return self._wait(key, "signal", name, timeout=_timeout(timeout))

    def wait_for_update(self, name: str, timeout: float | dt.timedelta | None = None, *,
                        key: str | None = None) -> Update:
        """Return the next update `name` sent with ``durable.update()`` (FIFO), waiting for one.

        The caller waits for the answer: give it with ``update.answer(value)``, or refuse with
        ``update.reject(reason)``. The request is kept until the run takes it and the answer is a
        journal entry written at once, so a worker that dies between them neither loses the request
        nor answers twice. Raise SignalTimeout if `timeout` passes first. Keyed
        ``update:<name>:<n>`` by call order unless `key` is given.
        """

        check_name(name, "update")
        key = key or self._auto_key("update", name)
        request = self._wait(key, "signal", f"{UPDATE_PREFIX}{name}", timeout=_timeout(timeout))
        if not (isinstance(request, dict) and isinstance(request.get("id"), str)):
            raise ValueError(f"The signal {UPDATE_PREFIX}{name!r} this run took is not an update sent with "
                             f"durable.update(): {request!r:.200}")
        return Update(self, name, request["id"], request.get("payload"))

    def _answer_update(self, update: Update, answer: dict) -> None:
        """Record the answer to `update` once (a replay finds it and writes nothing), at once: its
        caller is waiting for it."""
        key = f"{ANSWER_PREFIX}{update.id}"
        self._stop_if_diverged()
        self._used.setdefault(key, "an update's answer")
        entry = self._journal.get(key)
        if entry is not None:
            self._check_same(key, entry, "note", f"update {update.name}")
            return
        text = serialization.encode(answer, what=f"the answer to update {update.name!r}")
        self._record(key, f"update {update.name}", "completed", text, None, self._session.now(), 1, kind="note",
                     write="now")

    def wait_for_event(self, name: str, match: dict | None = None, timeout: float | dt.timedelta | None = None,
                       *, key: str | None = None, since: dt.datetime | None = None) -> Any:
        """Return the payload of an event `name` whose fields equal `match`, waiting for one.

        `match` maps field names (dotted paths into the payload, like ``"order.id"``) to values.
        An event emitted before this wait began counts too, if it was emitted at or after `since`
        (an aware datetime; by default when the run was created) and is still kept
        (DURABLE_EVENT_RETENTION): the oldest such event this run has not taken yet is returned
        at once. Each event is taken once per run. Raise SignalTimeout if `timeout` passes first.
        """

        check_name(name, "event")
        if match is not None and not (isinstance(match, dict) and all(isinstance(k, str) for k in match)):
            raise ValueError(f"match must be a dict of field names to values, not {match!r}.")
        if since is not None and (not isinstance(since, dt.datetime) or timezone.is_naive(since)):
            raise ValueError(f"since must be an aware datetime, not {since!r}.")
        key = key or self._auto_key("event", name)
        match_text = serialization.encode(match or {}, what="event match")
        return self._wait(key, "event", name, timeout=_timeout(timeout), match=match_text, since=since)

    def wait_for_approval(self, key: str, *, approvers, timeout: float | dt.timedelta | None = None, quorum: int = 1,
                          message: str = "", data: dict | None = None) -> dict:
        """Wait for people to approve or reject; return {"approved": bool, "by": [...], "decisions": [...]}.

        `approvers` says who may decide: a permission (``"orders.approve_refund"``), a Group or
        ``{"group": name}``, or a list of users (or their primary keys). `quorum` different users
        must approve; one rejection rejects. `message` and `data` (JSON) are what the approvers
        see in the admin's approval inbox, the e-mailed link's page and the API. Each decision
        is in the run's audit trail with its user. Raise ApprovalTimeout if `timeout` passes
        first. See django_durable.services.approvals.
        """
        from ..approvers import approvers_spec

        spec = approvers_spec(approvers)
        if isinstance(quorum, bool) or not isinstance(quorum, int) or not 1 <= quorum <= 100:
            raise ValueError(f"quorum must be a whole number from 1 to 100, not {quorum!r}.")
        if "users" in spec and quorum > len(spec["users"]):
            raise ValueError(f"quorum={quorum} but only {len(spec['users'])} user(s) may decide.")
        data_text = serialization.encode(data or {}, what="approval data")
        opening = (spec, quorum, str(message)[:2000], data_text)
        return self._wait(key, "approval", key, timeout=_timeout(timeout), approval=opening)

    @property
    def cancel_requested(self) -> bool:
        """True once someone asked to cancel this run; a long step may check it to stop early."""
        return self._session.claim.cancel_requested

    # -- the common path ------------------------------------------------------------------------

    def _auto_key(self, kind: str, name: str) -> str:
        counter = f"{kind}:{name}"
        count = self._counters.get(counter, 0)
        self._counters[counter] = count + 1
        return f"{kind}:{name}:{count}"

    def _wait(self, key, kind, name, *, until=None, timeout=None, match=None, since=None, approval=None) -> Any:
        self._claim_key(key, f"ctx.{_CALLS[kind]}({'' if kind in ('sleep', 'approval') else repr(name)})")
        entry = self._journal.get(key)
        if entry is not None:
            self._check_same(key, entry, kind, name)
            if entry.status in ("completed", "failed"):
                return self._replay_final(key, entry)
        now = self._session.now()
        if entry is not None:
            deadline = as_datetime(entry.deadline_at)
        elif until is not None:
            deadline = until(now)
        else:
            deadline = now + dt.timedelta(seconds=timeout) if timeout is not None else None
        if kind != "sleep":
            # First come wins, by the database's clock: a message stored after the deadline
            # loses to the timeout even if no worker looked in between.
            message = self._session.take_message(kind, name, key, before=deadline)
            if message is None and kind == "event" and entry is None:
                # Emitted before this wait began: a kept event counts (the first time only; later,
                # one emitted meanwhile is delivered to the wait like any event).
                message = self._session.take_stored_event(key, name, match, since)
            if message is not None:
                message_id, payload = message
                # The consumption is written with this entry, in one statement: never twice, never lost.
                self._record(key, name, "completed", payload, None, now, 1, kind=kind, consumes=message_id)
                return serialization.decode(payload)
        if deadline is not None and self._session.passed(deadline):
            if kind == "sleep":
                # Derivable: a replay would find the same recorded wake-up time passed.
                self._record(key, name, "completed", None, None, now, 1, kind=kind, deadline=deadline,
                             derivable=True)
                return None
            exc = (ApprovalTimeout(f"Nobody decided the approval {name!r} by {deadline:%Y-%m-%d %H:%M:%S} UTC.")
                   if kind == "approval" else
                   SignalTimeout(f"No {kind} {name!r} arrived by {deadline:%Y-%m-%d %H:%M:%S} UTC."))
            error = serialization.dumps_error(exc)
            self._record(key, name, "failed", None, error, now, 1, kind=kind, deadline=deadline)
            raise exc
        self._stop_if_cancelled()
        timers = []
        if entry is None:
            if approval is not None:
                # Earlier checkpoints first: the approval is asked of people, an effect.
                self._session.before_step(key)
                self._session.open_approval(key, *approval, deadline)
            self._record(key, name, "waiting", None, None, now, 1, kind=kind, deadline=deadline, match=match)
            if kind == "event":
                self._session.event_waits[key] = (name, match, since)
            if deadline is not None:
                timers.append(("sleep" if kind == "sleep" else "signal_timeout", key, deadline))
        raise Suspend(_waiting_on(kind, name, deadline, match), timers=timers)


def _waiting_on(kind, name, deadline, match) -> str:
    until = f" until {deadline:%Y-%m-%d %H:%M:%S} UTC" if deadline is not None else ""
    if kind == "sleep":
        return f"sleep {name!r}{until}"
    if kind == "signal":
        return f"signal {name!r}{until}"
    if kind == "approval":
        return f"approval {name!r}{until}"
    matching = f" matching {match}" if match and match != "{}" else ""
    return f"event {name!r}{matching}{until}"


def _timeout(timeout) -> float | None:
    return None if timeout is None else clock.seconds(timeout, "A timeout", zero=False)


