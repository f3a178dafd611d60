"""URLs of the example project: the shop's pages, the admin (the operator dashboard) and the REST API."""

from django.contrib import admin
from django.urls import include, path

from example_project.orders import views

urlpatterns = [
    path("", views.home, name="home"),
    path("orders/", views.place_order, name="place_order"),
    path("orders/<int:order_id>/", views.order, name="order"),
    path("orders/<int:order_id>/refund/", views.ask_refund, name="ask_refund"),
    path("orders/<int:order_id>/support/", views.ask_support, name="ask_support"),
    path("orders/<int:order_id>/support/<uuid:run_id>/", views.ticket, name="ticket"),
    path("images/", views.render_images, name="render_images"),
    path("refunds/<uuid:run_id>/decide/", views.decide, name="decide"),
    path("orders/<int:order_id>/fulfil/", views.fulfil, name="fulfil"),
    path("admin/", admin.site.urls),
    path("api/durable/", include("django_durable.api.urls")),
    path("durable/", include("django_durable.urls")),
]
