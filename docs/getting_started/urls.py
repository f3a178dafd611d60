# Added at the end of mysite/urls.py: the REST API under /api/durable/.
from django.urls import include

urlpatterns += [path("api/durable/", include("django_durable.api.urls"))]
