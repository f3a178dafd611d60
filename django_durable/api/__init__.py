"""The REST API: DRF routes over the same service functions as the Python API and the admin.

Mount it with ``path("api/durable/", include("django_durable.api.urls"))``.
"""
