"""The API's routes. In your project: ``path("api/durable/", include("django_durable.api.urls"))``."""

from django.urls import re_path
from rest_framework.routers import SimpleRouter

from . import errors, views

app_name = "durable-api"

router = SimpleRouter()
router.register("workflows/definitions", views.DefinitionViewSet, basename="definition")
router.register("workflows", views.WorkflowRunViewSet, basename="run")
router.register("schedules", views.ScheduleViewSet, basename="schedule")
router.register("queues", views.QueueViewSet, basename="queue")

urlpatterns = [
    *router.urls,
    re_path(r"^events/(?P<name>[^/]{1,200})/$", views.EventView.as_view(), name="event"),
    re_path(r"^approvals/$", views.ApprovalView.as_view(), name="approvals"),
    re_path(rf"^workflows/(?P<pk>{views.UUID})/approvals/(?P<key>[^/]{{1,255}})/$", views.DecisionView.as_view(),
            name="decide"),
    re_path(r"^schema/$", views.SchemaView.as_view(), name="schema"),
    # Anything else here (a malformed id, say) is a JSON 404, answered without a query.
    re_path(r"^(?P<path>.*)$", errors.not_found),
]
