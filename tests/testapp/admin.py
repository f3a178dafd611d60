"""A model's runs on its own admin page (django_durable.admin.DurableSubjectAdmin)."""

from django.contrib import admin

from django_durable.admin import DurableSubjectAdmin

from .models import Ticket


@admin.register(Ticket)
class TicketAdmin(DurableSubjectAdmin, admin.ModelAdmin):
    list_display = ("pk", "title")
    durable_start = {"tests.ticket_flow": lambda ticket: {"ticket_id": ticket.pk}}
