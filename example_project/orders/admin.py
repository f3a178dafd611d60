"""The shop's orders in the admin, each with its workflow runs on its page (DurableSubjectAdmin)."""

from django.contrib import admin

from django_durable.admin import DurableSubjectAdmin

from .models import Order


@admin.register(Order)
class OrderAdmin(DurableSubjectAdmin, admin.ModelAdmin):
    list_display = ("pk", "customer", "total", "status", "created_at")
    durable_start = {"orders.fulfil": lambda order: {"order_id": order.pk}}
