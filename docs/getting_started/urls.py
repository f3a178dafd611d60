# Added at the end of mysite/urls.py: the REST API under /api/durable/, and the health probes,
# metrics and run pages under /durable/, put first so that no catch-all route (Wagtail's pages,
# a CMS's) answers their paths before they do.
from django.urls import include

urlpatterns[:0] = [
    path("api/durable/", include("django_durable.api.urls")),
    path("durable/", include("django_durable.urls")),
]
