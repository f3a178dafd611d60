# Added at the end of mysite/urls.py: the REST API under /api/durable/, put first so that no
# catch-all route (Wagtail's pages, a CMS's) answers its paths before it does.
from django.urls import include

urlpatterns.insert(0, path("api/durable/", include("django_durable.api.urls")))
