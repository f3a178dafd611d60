from django.contrib import admin
from django.http import JsonResponse
from django.urls import include, path

from django_durable.models import WorkflowRun


def bare_status(request, pk):
    """The least a status endpoint can do: one query, a dict, JSON. The API's baseline."""
    if not request.user.is_staff:
        return JsonResponse({}, status=403)
    run = WorkflowRun.objects.values("id", "workflow", "status", "waiting_on", "result", "created_at",
                                     "updated_at", "finished_at").get(pk=pk)
    return JsonResponse(run)


urlpatterns = [
    path("admin/", admin.site.urls),
    path("api/durable/", include("django_durable.api.urls")),
    path("bare/<uuid:pk>/", bare_status),
]
