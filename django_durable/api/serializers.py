"""What the API reads and writes. Inputs are checked here; outputs hide payloads from users
without the view_payload permission."""

from __future__ import annotations

from collections.abc import Mapping

from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from .. import conf, registry, serialization
from ..workpool import evidence
from ..humanize import describe_cron, humanize_interval
from ..models import Schedule, Step, WorkflowRun

ERROR_MESSAGE_CHARS = 1000
JOURNAL_LIMIT = 1000


class ErrorSerializer(serializers.Serializer):
    type = serializers.CharField()
    message = serializers.CharField()


class AttemptErrorSerializer(serializers.Serializer):
    attempt = serializers.IntegerField(allow_null=True, help_text="The run's attempt.")
    step = serializers.CharField(allow_null=True, help_text="The step's key; null for the run's own error.")
    step_attempt = serializers.IntegerField(allow_null=True, help_text="The step's attempt.")
    type = serializers.CharField()
    message = serializers.CharField()
    current = serializers.BooleanField(help_text="False for attempts a retry of the run left behind.")


class StepSerializer(serializers.Serializer):
    key = serializers.CharField()
    seq = serializers.IntegerField()
    kind = serializers.ChoiceField(choices=Step.Kind.choices)
    name = serializers.CharField()
    status = serializers.ChoiceField(choices=[*Step.Status.choices, (Step.STOPPED, "Stopped (the run ended first)")])
    attempts = serializers.IntegerField()
    started_at = serializers.DateTimeField(allow_null=True)
    finished_at = serializers.DateTimeField(allow_null=True)
    result = serializers.JSONField(allow_null=True, help_text="Null unless the user may see payloads.")
    error = ErrorSerializer(allow_null=True, help_text="Null unless the user may see payloads.")


class ProgressSerializer(serializers.Serializer):
    done = serializers.JSONField(help_text="A number: how much is done.")
    total = serializers.JSONField(allow_null=True, help_text="A number, or null when the total is not known.")
    message = serializers.CharField(allow_blank=True)


class NoteSerializer(serializers.Serializer):
    key = serializers.CharField()
    at = serializers.DateTimeField(allow_null=True)
    message = serializers.CharField()
    data = serializers.JSONField(allow_null=True, help_text="Null unless the user may see payloads.")


class RunSummarySerializer(serializers.Serializer):
    """A run as the list shows it: no payloads, no journal."""

    id = serializers.UUIDField()
    workflow = serializers.CharField()
    kind = serializers.SerializerMethodField(help_text="workflow, or task: a django.tasks task.")
    status = serializers.ChoiceField(choices=WorkflowRun.Status.choices)
    waiting_on = serializers.CharField()
    waiting_for = serializers.ChoiceField(
        choices=[(kind, kind) for kind in WorkflowRun.WAITING_FOR], allow_blank=True,
        help_text="The kind of wait (empty: none): sleep, retry, signal, event, children, start or code.")
    queue = serializers.CharField()
    priority = serializers.IntegerField()
    concurrency_key = serializers.CharField(help_text="Empty: none (see DURABLE_QUEUES' key_concurrency).")
    attempt = serializers.IntegerField()
    max_attempts = serializers.IntegerField()
    parent = serializers.UUIDField(source="parent_id", allow_null=True)
    idempotency_key = serializers.CharField(allow_null=True)
    cancel_requested = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    scheduled_at = serializers.DateTimeField(allow_null=True)
    started_at = serializers.DateTimeField(allow_null=True)
    updated_at = serializers.DateTimeField()
    finished_at = serializers.DateTimeField(allow_null=True)
    deadline_at = serializers.DateTimeField(allow_null=True)

    @extend_schema_field({"type": "string", "enum": ["workflow", "task"]})
    def get_kind(self, run) -> str:
        definition = registry.find(run.workflow)
        return definition.kind if definition is not None else "workflow"

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_cancel_requested(self, run) -> bool:
        return run.cancel_requested_at is not None


class RunSerializer(RunSummarySerializer):
    """A run with its outcome and a summary of its journal (the whole journal with ?include=steps)."""

    waiting_on = serializers.SerializerMethodField(help_text="What the run waits for; a fan-out's count is current.")
    payload_visible = serializers.SerializerMethodField()
    input = serializers.SerializerMethodField()
    result = serializers.SerializerMethodField()
    error = serializers.SerializerMethodField()
    errors = serializers.SerializerMethodField()
    steps = serializers.SerializerMethodField()
    progress = serializers.SerializerMethodField()
    notes = serializers.SerializerMethodField()
    journal = serializers.SerializerMethodField()
    warning = serializers.SerializerMethodField()
    forked_from = serializers.UUIDField(allow_null=True, help_text="The run this one was forked from (durable.fork()).")
    forked_at_step = serializers.CharField(help_text="The step of that run it was forked from; empty: not a fork.")
    forks = serializers.SerializerMethodField()
    agent_usage = serializers.SerializerMethodField()

    def _payloads(self) -> bool:
        return bool(self.context.get("payloads"))

    @extend_schema_field({"type": "string", "nullable": True, "description": (
        "On a start, and on result/ while the run has not finished: set when no live worker serves the run's "
        "queue ('No worker is running: ...'), or the queue given is one neither DURABLE_QUEUES nor a "
        "workflow names (most likely a typo); the run is stored all the same. Otherwise null.")})
    def get_warning(self, run):
        return getattr(run, "warning", None)

    def get_waiting_on(self, run) -> str:
        return run.current_waiting_on()

    @extend_schema_field({"type": "array", "items": {"type": "string", "format": "uuid"},
                          "description": "The runs forked from this one (the first 100)."})
    def get_forks(self, run) -> list:
        return [str(pk) for pk in WorkflowRun.objects.using(run._state.db or "default").filter(forked_from=run.pk)
                .order_by("created_at").values_list("pk", flat=True)[:100]]

    @extend_schema_field({"type": "object", "nullable": True, "description": (
        "What the run's AI agents used (django_durable.contrib.pydantic_ai, .openai_agents): model requests, "
        "input and output tokens, the models, the cost in US dollars as a decimal string (null when no "
        "request's model has a known price) and how many requests were not priced. Null for a run without "
        "an agent."), "properties": {
            "requests": {"type": "integer"}, "input_tokens": {"type": "integer"}, "output_tokens": {"type": "integer"},
            "cost": {"type": "string", "nullable": True}, "unpriced": {"type": "integer"},
            "models": {"type": "array", "items": {"type": "string"}}}})
    def get_agent_usage(self, run):
        if run.started_at is None:
            return None
        from ..contrib import agent_runs

        usage = agent_runs.usage_of(run)
        return None if usage is None else usage.as_dict()

    @extend_schema_field(OpenApiTypes.BOOL)
    def get_payload_visible(self, run) -> bool:
        return self._payloads()

    @extend_schema_field({"type": "object", "nullable": True, "description": "args and kwargs; null unless payloads are visible"})
    def get_input(self, run):
        return serialization.display(run.input) if self._payloads() else None

    @extend_schema_field({"nullable": True, "description": "what the workflow returned; null unless completed and payloads are visible"})
    def get_result(self, run):
        return serialization.display(run.result) if self._payloads() else None

    @extend_schema_field(ErrorSerializer(allow_null=True))
    def get_error(self, run):
        return serialization.error_parts(run.error, limit=ERROR_MESSAGE_CHARS) if self._payloads() else None

    @extend_schema_field(AttemptErrorSerializer(many=True, allow_null=True))
    def get_errors(self, run):
        """Every error of every attempt, the run's and its steps', oldest first (a retry keeps them)."""
        if not self._payloads():
            return None
        if run.started_at is None:
            return []  # never ran: nothing can have failed (and a start costs no query for it)
        return AttemptErrorSerializer(evidence.history(run, db=conf.get("DATABASE")), many=True).data

    @extend_schema_field({"type": "object", "additionalProperties": {"type": "integer"},
                          "description": "how many journal entries have each status"})
    def get_steps(self, run) -> dict:
        return run.step_counts()

    @extend_schema_field(ProgressSerializer(allow_null=True))
    def get_progress(self, run):
        """What the workflow last set with ctx.set_progress(): shown whoever may see the run."""
        return run.progress() if run.started_at is not None else None

    @extend_schema_field(NoteSerializer(many=True))
    def get_notes(self, run):
        """The workflow's notes (ctx.note()), oldest first; their data only if payloads are visible."""
        if run.started_at is None:
            return []
        notes = run.notes()
        if not self._payloads():
            notes = [{**note, "data": None} for note in notes]
        return NoteSerializer(notes, many=True).data

    @extend_schema_field(StepSerializer(many=True, allow_null=True))
    def get_journal(self, run):
        if not self.context.get("include_steps"):
            return None
        payloads = self._payloads()
        rows = []
        for step in run.steps.order_by("seq")[:JOURNAL_LIMIT]:
            rows.append({
                "key": step.key, "seq": step.seq, "kind": step.kind, "name": step.name,
                "status": Step.shown_status(step.status, step.kind, run.is_finished),
                "attempts": step.attempts, "started_at": step.started_at, "finished_at": step.finished_at,
                "result": serialization.display(step.result) if payloads else None,
                "error": serialization.error_parts(step.error, limit=ERROR_MESSAGE_CHARS) if payloads else None,
            })
        return StepSerializer(rows, many=True).data


class StrictSerializer(serializers.Serializer):
    """A request body: a JSON object whose keys are all known. A misspelt or misplaced key (a
    signal's value sent without its "payload" envelope) is refused, never silently dropped."""

    def to_internal_value(self, data):
        if isinstance(data, Mapping):
            unknown = [key for key in data if key not in self.fields]
            if unknown:
                known = ", ".join(self.fields)
                raise serializers.ValidationError(
                    {str(key)[:100]: [serializers.ErrorDetail(
                        f"Unknown field. This body takes: {known}.{self.hint}", code="unknown_field")]
                     for key in unknown[:20]}
                )
        return super().to_internal_value(data)

    hint = ""


class DebounceSerializer(StrictSerializer):
    key = serializers.CharField(max_length=200)
    seconds = serializers.FloatField(min_value=0.001, max_value=366 * 86400)


class ThrottleSerializer(StrictSerializer):
    key = serializers.CharField(max_length=200)
    limit = serializers.IntegerField(min_value=1, max_value=1_000_000)
    seconds = serializers.FloatField(min_value=0.001, max_value=366 * 86400)


class StartSerializer(StrictSerializer):
    workflow = serializers.CharField(max_length=200, help_text="A registered workflow name.")
    args = serializers.ListField(child=serializers.JSONField(allow_null=True), required=False, default=list)
    kwargs = serializers.DictField(child=serializers.JSONField(allow_null=True), required=False, default=dict)
    idempotency_key = serializers.CharField(max_length=255, required=False, allow_null=True)
    run_at = serializers.DateTimeField(required=False, allow_null=True, help_text="Start at this time.")
    delay = serializers.FloatField(required=False, allow_null=True, min_value=0, help_text="Start in this many seconds.")
    queue = serializers.CharField(max_length=100, required=False, allow_null=True)
    priority = serializers.IntegerField(required=False, allow_null=True, min_value=-(2**31), max_value=2**31 - 1)
    concurrency_key = serializers.CharField(max_length=200, required=False, allow_null=True,
                                            help_text="Runs of one key share their queue's key_concurrency.")
    singleton = serializers.CharField(max_length=200, required=False, allow_null=True, help_text=(
        "At most one unfinished run of the workflow per key: a second start answers 200 with that run "
        "(409 where the workflow refuses)."))
    debounce = DebounceSerializer(required=False, allow_null=True, help_text=(
        "Start once the key has been quiet for `seconds`, with the last call's input; the calls before "
        "answer 200 with the same pending run."))
    throttle = ThrottleSerializer(required=False, allow_null=True, help_text=(
        "At most `limit` runs of the key become ready in any `seconds`; the others are delayed, not dropped."))

    def validate_workflow(self, value):
        # Only names in the registry: nothing is imported, and the refused name is not echoed.
        if registry.find(value) is None:
            # The suggestion names a registered workflow, never the refused name.
            raise serializers.ValidationError(f"No workflow is registered under this name.{registry.closest(value)}",
                                              code="unknown_workflow")
        return value

    def validate(self, data):
        from ..services import gates

        if data.get("run_at") is not None and data.get("delay") is not None:
            raise serializers.ValidationError({"delay": ["Give run_at or delay, not both."]})
        if data.get("debounce"):
            data["debounce"] = (data["debounce"]["key"], data["debounce"]["seconds"])
        if data.get("throttle"):
            data["throttle"] = (data["throttle"]["key"], data["throttle"]["limit"], data["throttle"]["seconds"])
        gated = [name for name in ("singleton", "debounce", "throttle") if data.get(name) is not None]
        if gated and (data.get("run_at") is not None or data.get("delay") is not None
                      or data.get("idempotency_key") is not None):
            raise serializers.ValidationError({gated[0]: ["Give it without run_at, delay or idempotency_key."]})
        try:
            gates.options(data.get("singleton"), data.get("debounce"), data.get("throttle"))
        except ValueError as exc:
            raise serializers.ValidationError({gated[0] if gated else "non_field_errors": [str(exc)]}) from None
        return data


class ForkSerializer(StrictSerializer):
    from_step = serializers.CharField(max_length=255, help_text="The key of the step to fork from: the journal "
                                                                "before it is copied, it and the rest run anew.")


class RepairSerializer(StrictSerializer):
    repair = serializers.ChoiceField(choices=["retry", "rerun", "cancel", "force-fail"],
                                     help_text="retry (failed, timed-out, cancelled, blocked and paused runs), rerun "
                                               "(a new run from from_step), cancel or force-fail (unfinished runs).")
    filter = serializers.DictField(help_text="The runs: workflow, status (one or a list), queue, created_after, "
                                             "created_before (ISO 8601 with a time zone), error (a piece of its "
                                             "text). At least one.")
    from_step = serializers.CharField(max_length=255, required=False, default="",
                                      help_text="For rerun: the key of the step to rerun from.")
    reason = serializers.CharField(max_length=500, required=False, default="", allow_blank=True,
                                   help_text="For cancel and force-fail: recorded with each run.")
    batch = serializers.IntegerField(min_value=1, max_value=5000, required=False, default=200,
                                     help_text="Runs a step of the repair takes at a time.")
    dry_run = serializers.BooleanField(required=False, default=True,
                                       help_text="true (the default): count and sample, change nothing; false: "
                                                 "start the repair.")


class RepairPlanSerializer(serializers.Serializer):
    repair = serializers.CharField()
    filter = serializers.DictField()
    matched = serializers.IntegerField(help_text="Runs the filter matches.")
    eligible = serializers.IntegerField(help_text="Of those, the runs the repair may take.")
    sample = serializers.ListField(child=serializers.DictField(), help_text="The newest eligible runs.")
    until = serializers.CharField(allow_null=True, help_text="The repair goes no further than this run id.")
    run = serializers.CharField(required=False, help_text="The repair's own run (durable.repair), once started.")


class QueueStateSerializer(serializers.Serializer):
    name = serializers.CharField()
    paused = serializers.BooleanField()
    reason = serializers.CharField(allow_blank=True, help_text="Why it was paused.")
    pending = serializers.IntegerField(help_text="Items waiting in it.")
    configured = serializers.CharField(help_text="Its limits as DURABLE_QUEUES sets them.")
    overrides = serializers.DictField(help_text="The limits set at runtime: concurrency, key_concurrency, rate_limit.")
    in_force = serializers.CharField(help_text="The limits in force now.")
    changed_at = serializers.DateTimeField(allow_null=True)
    changed_by = serializers.CharField(allow_blank=True)


class QueuePauseSerializer(StrictSerializer):
    reason = serializers.CharField(max_length=500, required=False, default="", allow_blank=True)


class QueueLimitsSerializer(StrictSerializer):
    concurrency = serializers.IntegerField(min_value=1, max_value=1_000_000, required=False, allow_null=True,
                                           help_text="Items of the queue running at once; null drops the override.")
    key_concurrency = serializers.IntegerField(min_value=1, max_value=1_000_000, required=False, allow_null=True,
                                               help_text="Items of one concurrency key at once; null drops it.")
    rate_limit = serializers.CharField(max_length=50, required=False, allow_null=True, allow_blank=True,
                                       help_text="Claims per period, such as \"10/s\"; null drops it.")


class DescribeSerializer(StrictSerializer):
    kwargs = serializers.DictField(child=serializers.JSONField(allow_null=True), required=False, default=dict,
                                   help_text="The input to describe the shape for; parameters left out take "
                                             "their defaults.")


class ShapeSerializer(serializers.Serializer):
    """durable.describe(workflow, **input): the shape of a run started with that input."""

    workflow = serializers.CharField()
    kind = serializers.CharField()
    description = serializers.CharField(allow_blank=True)
    shape = serializers.ListField(child=serializers.DictField())
    problems = serializers.ListField(child=serializers.CharField())


class SignalSerializer(StrictSerializer):
    hint = ' Send the value under "payload": {"payload": {"approved": false}}.'

    payload = serializers.JSONField(required=False, allow_null=True, default=None)
    idempotency_key = serializers.CharField(max_length=255, required=False, allow_null=True)


class SignalSentSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    run = serializers.UUIDField()
    name = serializers.CharField()
    created_at = serializers.DateTimeField()
    warning = serializers.CharField(allow_null=True, help_text=(
        "Set when the run's workflow never waits for a signal of this name (the names it waits for are in "
        "the text): the signal is kept all the same, for a later version of the code. Otherwise null."))


class UpdateSerializer(StrictSerializer):
    hint = ' Send the value under "payload": {"payload": {"quantity": 3}}.'

    payload = serializers.JSONField(required=False, allow_null=True, default=None)
    wait = serializers.FloatField(required=False, default=None, allow_null=True, min_value=0, help_text=(
        "Seconds to wait for the answer (capped by DURABLE_API_MAX_WAIT, its default)."))


class UpdateAnswerSerializer(serializers.Serializer):
    id = serializers.CharField(help_text="The update's id: GET .../updates/{name}/{id}/ asks for its answer again.")
    status = serializers.ChoiceField(choices=[("answered", "answered"), ("waiting", "waiting")])
    answer = serializers.JSONField(allow_null=True, help_text="What the workflow answered (null while waiting).")


class EventSerializer(StrictSerializer):
    hint = ' Send the value under "payload": {"payload": {"order": 42}}.'

    payload = serializers.JSONField(required=False, allow_null=True, default=None)


class EventSentSerializer(serializers.Serializer):
    name = serializers.CharField()
    delivered = serializers.IntegerField(help_text="How many waiting runs took it.")


class ScheduleSerializer(serializers.Serializer):
    slug = serializers.CharField()
    workflow = serializers.CharField()
    cron = serializers.CharField()
    interval = serializers.FloatField(allow_null=True)
    timezone = serializers.CharField()
    description = serializers.SerializerMethodField()
    status = serializers.ChoiceField(choices=Schedule.Status.choices)
    overlap = serializers.ChoiceField(choices=Schedule.Overlap.choices)
    catch_up = serializers.ChoiceField(choices=Schedule.CatchUp.choices)
    queue = serializers.CharField()
    declared = serializers.BooleanField()
    next_fire_at = serializers.DateTimeField(allow_null=True)
    last_fire_at = serializers.DateTimeField(allow_null=True)
    last_run = serializers.UUIDField(source="last_run_id", allow_null=True)

    @extend_schema_field(OpenApiTypes.STR)
    def get_description(self, schedule) -> str:
        return describe_cron(schedule.cron) if schedule.cron else humanize_interval(schedule.interval)


class DefinitionSerializer(serializers.Serializer):
    """A registered workflow or durable task (durable.workflows())."""

    name = serializers.CharField()
    kind = serializers.CharField(help_text="workflow, or task: a django.tasks task.")
    description = serializers.CharField(allow_blank=True, help_text="The function's docstring.")
    function = serializers.CharField(help_text="module.qualified_name")
    queue = serializers.CharField()
    priority = serializers.IntegerField()
    max_attempts = serializers.IntegerField(help_text="Attempts of the whole run.")
    timeout = serializers.FloatField(allow_null=True, help_text="The run's deadline, in seconds after it starts.")
    retry = serializers.DictField(help_text="The steps' retry policy.")
    compensate_on_failure = serializers.BooleanField()
    compensate_on_cancel = serializers.BooleanField()
    schedule = serializers.JSONField(allow_null=True, help_text="The declared schedule: a cron string or options.")
    input = serializers.ListField(child=serializers.DictField(), help_text="The parameters a run's input fills.")
    input_schema = serializers.DictField(allow_null=True, help_text="JSON Schema of the input its `input` "
                                                                    "serializer accepts, or null when it declares none.")
    shape = serializers.ListField(child=serializers.DictField(), required=False,
                                  help_text="durable.describe()'s shape: steps, waits, switches, fan-outs, children.")


class ErrorBodySerializer(serializers.Serializer):
    """Every error response: {"error": {"code": ..., "message": ..., "fields": {...}}}."""

    error = serializers.DictField(help_text="code (stable), message, and for invalid input the fields")


class DecisionSerializer(serializers.Serializer):
    user = serializers.CharField(source="username")
    approved = serializers.BooleanField()
    comment = serializers.CharField(allow_blank=True)
    at = serializers.DateTimeField()


class ApprovalSerializer(serializers.Serializer):
    """An approval a run waits for (ctx.wait_for_approval), as its approvers see it."""

    run = serializers.UUIDField(source="run_id")
    workflow = serializers.CharField(source="run.workflow")
    key = serializers.CharField()
    message = serializers.CharField(allow_blank=True, help_text="What the approvers are asked.")
    data = serializers.JSONField(help_text="The context the workflow gave with the question.")
    approvers = serializers.CharField(help_text="Who may decide, as a person reads it.")
    quorum = serializers.IntegerField(help_text="How many different users must approve.")
    status = serializers.ChoiceField(choices=["pending", "approved", "rejected"])
    created_at = serializers.DateTimeField()
    deadline_at = serializers.DateTimeField(allow_null=True)
    decisions = DecisionSerializer(many=True, source="decisions.all")


class DecideSerializer(StrictSerializer):
    approve = serializers.BooleanField(help_text="true approves, false rejects.")
    comment = serializers.CharField(required=False, allow_blank=True, default="", max_length=4000)
