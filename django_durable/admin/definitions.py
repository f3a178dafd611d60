"""The registered workflows and tasks (durable.workflows()): a list, and each one's page with its shape."""

from __future__ import annotations

import json

from django.contrib import admin
from django.http import Http404
from django.template.response import TemplateResponse
from django.urls import path, reverse

from .. import registry
from ..catalog import definition_data, workflows
from ..engine.describe import describe
from ..exceptions import InvalidArguments
from ..models import Definition
from . import graph
from .base import PageAdmin


@admin.register(Definition)
class DefinitionAdmin(PageAdmin):
    def get_urls(self):
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        return self.page_urls(path("<path:workflow>/", self.admin_site.admin_view(self.definition_view),
                                   name=f"{name}_detail"))

    def changelist_view(self, request, extra_context=None):
        self.check_view(request)
        return TemplateResponse(request, "admin/django_durable/definitions.html", self.page_context(
            request, "Registered workflows and tasks", definitions=workflows(shapes=False), runs_url=self._runs_url()))

    def definition_view(self, request, workflow):
        self.check_view(request)
        definition = registry.find(workflow)
        if definition is None:
            raise Http404(f"No workflow is registered under the name {workflow!r}.")
        data = definition_data(definition)
        text, problem = request.GET.get("input", "").strip(), ""
        if text and definition.kind != "task":  # the shape for this input (durable.describe(name, **input))
            try:
                given = json.loads(text)
                if not isinstance(given, dict):
                    raise ValueError("the input is a JSON object of the workflow's keyword arguments")
                data["shape"] = describe(definition.name, **given)["shape"]
            except (ValueError, InvalidArguments) as exc:
                problem = str(exc)
        site = self.admin_site.name
        drawn = graph.render(graph.shape_items(data["shape"], definition_url=lambda name: reverse(
            f"{site}:django_durable_definition_detail", args=[name]) if registry.find(name) else ""),
            label=f"Graph of the workflow {definition.name}")
        return TemplateResponse(request, "admin/django_durable/definition.html", self.page_context(
            request, definition.name, definition=data, graph=drawn, runs_url=self._runs_url(), input=text,
            input_problem=problem))

    def _runs_url(self) -> str:
        return reverse(f"{self.admin_site.name}:django_durable_workflowrun_changelist")
