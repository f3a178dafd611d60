"""URLs of the example project: the admin (the operator dashboard), the REST API and a small home page."""

from django.contrib import admin
from django.urls import include, path

from example_project.orders import views

urlpatterns = [
    path("", views.home, name="home"),
    path("refunds/<uuid:run_id>/decide/", views.decide, name="decide"),
    path("orders/<int:order_id>/fulfil/", views.fulfil, name="fulfil"),
    path("admin/", admin.site.urls),
    path("api/durable/", include("django_durable.api.urls")),
    path("durable/", include("django_durable.urls")),
]
