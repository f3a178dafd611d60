"""The forms behind the admin's parametrised actions; JSON is parsed and checked as the services would."""

from __future__ import annotations

import json

from django import forms
from django.core.exceptions import ValidationError
from django.utils.html import format_html, format_html_join

from .. import conf, registry, serialization
from ..exceptions import NotSerializable, PayloadTooLarge

MISSING = object()


class JSONValueField(forms.CharField):
    """JSON text in, the Python value out; within DURABLE_MAX_PAYLOAD_BYTES."""

    widget = forms.Textarea(attrs={"rows": 6, "cols": 80, "class": "vLargeTextField durable-json", "spellcheck": "false"})

    def __init__(self, *, expect: type | None = None, **kwargs):
        self.expect = expect
        kwargs.setdefault("required", False)
        super().__init__(strip=True, **kwargs)

    def to_python(self, value):
        text = super().to_python(value)
        if text in ("", None):
            value = [] if self.expect is list else {} if self.expect is dict else None
        else:
            try:
                value = json.loads(text)
            except ValueError as exc:
                raise ValidationError(f"This is not valid JSON: {exc}.") from None
        if self.expect is not None and not isinstance(value, self.expect):
            raise ValidationError(f"Enter a JSON {'list' if self.expect is list else 'object'}.")
        try:
            serialization.encode(value, what="value", max_bytes=conf.get("MAX_PAYLOAD_BYTES"))
        except (NotSerializable, PayloadTooLarge) as exc:
            raise ValidationError(str(exc)) from None
        return value


class ReasonForm(forms.Form):
    reason = forms.CharField(
        required=False, max_length=500, widget=forms.TextInput(attrs={"size": 80}),
        help_text="Recorded as the run's error and in its audit trail.",
    )


class NoForm(forms.Form):
    """A confirmation without parameters."""


class StepForm(forms.Form):
    key = forms.CharField(max_length=255, help_text="The step's key in the journal.")
    result = JSONValueField(label="Result (JSON)", help_text="What the workflow receives from the step.")

    def __init__(self, *args, keys=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.keys = list(keys)
        self.fields["key"].widget.attrs.update({"list": "durable-step-keys", "size": 60, "autocomplete": "off"})


class ForkForm(forms.Form):
    from_step = forms.ChoiceField(label="From the step", help_text=(
        "The new run copies the journal before this step; this step and those after it run on the code "
        "installed now."))

    def __init__(self, *args, steps=(), **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["from_step"].choices = [(key, f"{seq}. {key} ({kind}, {status})") for seq, key, kind, status in steps]


class SuggestingInput(forms.TextInput):
    """A text input offering `suggestions` (a <datalist>) while taking any text."""

    def __init__(self, suggestions=(), attrs=None):
        super().__init__(attrs)
        self.suggestions = list(suggestions)

    def render(self, name, value, attrs=None, renderer=None):
        attrs = {**(attrs or {}), "list": f"durable-{name}-choices"} if self.suggestions else attrs
        html = super().render(name, value, attrs, renderer)
        if not self.suggestions:
            return html
        options = format_html_join("", '<option value="{}">', ((choice,) for choice in self.suggestions))
        return format_html('{}<datalist id="durable-{}-choices">{}</datalist>', html, name, options)


class SignalForm(forms.Form):
    name = forms.CharField(max_length=200, widget=SuggestingInput(attrs={"size": 40}))
    payload = JSONValueField(label="Payload (JSON)", help_text="Empty for null.")
    idempotency_key = forms.CharField(
        max_length=255, required=False, help_text="Optional: sending again with this key stores nothing new."
    )

    def __init__(self, *args, awaited: tuple[list[str], bool] | None = None, **kwargs):
        """`awaited`: the signal names the run's workflow waits for, and whether its shape is whole."""
        super().__init__(*args, **kwargs)
        if awaited is None:
            return  # several runs at once, or a workflow not registered here
        names, whole = awaited
        self.fields["name"].widget.suggestions = names
        waits = ", ".join(names) if names else "no signal"
        self.fields["name"].help_text = (
            f"Its workflow waits for {waits}{'' if whole else ' (as far as its shape can be found)'}. "
            "Another name is kept for a later version of the code, but nothing takes it now.")


class WakeForm(forms.Form):
    timer = forms.IntegerField(required=False, widget=forms.HiddenInput)


class StartForm(forms.Form):
    workflow = forms.ChoiceField(choices=(), error_messages={"invalid_choice": "Select a registered workflow."})
    args = JSONValueField(expect=list, label="Positional arguments (JSON list)", initial="[]")
    kwargs = JSONValueField(expect=dict, label="Keyword arguments (JSON object)", initial="{}")
    queue = forms.CharField(max_length=100, required=False, help_text="Empty: the workflow's own queue.")
    idempotency_key = forms.CharField(
        max_length=255, required=False, help_text="Optional: starting again with this key returns the first run."
    )
    delay = forms.FloatField(required=False, min_value=0, label="Delay (seconds)", help_text="Optional: start later.")

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # Only registered names are offered or accepted: nothing is ever imported from a name.
        self.fields["workflow"].choices = [(name, name) for name in registry.names()]


class RepairForm(forms.Form):
    """A repair by filter (services/repairs.py): the action, the runs it takes, and its options."""

    repair = forms.ChoiceField(choices=[("retry", "Retry from the last checkpoint"), ("rerun", "Rerun from a step"),
                                        ("cancel", "Cancel"), ("force-fail", "Force fail")])
    workflow = forms.CharField(required=False, max_length=255, widget=forms.TextInput(attrs={"size": 50}))
    status = forms.MultipleChoiceField(required=False, widget=forms.CheckboxSelectMultiple)
    queue = forms.CharField(required=False, max_length=100)
    created_after = forms.DateTimeField(required=False, help_text="In the admin's time zone, such as 2026-11-28 09:00.")
    created_before = forms.DateTimeField(required=False)
    error = forms.CharField(required=False, max_length=200, label="Error containing",
                            widget=forms.TextInput(attrs={"size": 50}))
    from_step = forms.CharField(required=False, max_length=255, label="From step",
                                help_text="For a rerun: the key of the step the new runs start again from.")
    reason = forms.CharField(required=False, max_length=500, widget=forms.TextInput(attrs={"size": 80}),
                             help_text="For a cancel or a forced failure: recorded with each run.")
    batch = forms.IntegerField(min_value=1, max_value=5000, initial=200, required=False,
                               help_text="Runs each step of the repair takes, each in a transaction of its own.")

    def __init__(self, *args, **kwargs):
        from ..models import WorkflowRun

        super().__init__(*args, **kwargs)
        self.fields["status"].choices = WorkflowRun.Status.choices

    def filter_data(self) -> dict:
        """The filter, as services.repairs.RunFilter.parse() takes it."""
        data = self.cleaned_data
        return {name: data[name] for name in ("workflow", "status", "queue", "created_after", "created_before", "error")
                if data.get(name)}
