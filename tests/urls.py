"""The example project's URLs, and the durable views the tests call."""

from django.urls import path

from example_project.urls import urlpatterns as example
from tests.testapp import views

urlpatterns = [
    path("test/quick/", views.quick),
    path("test/slow/", views.slow),
    path("test/slow-page/", views.slow_page),
    *example,
]
