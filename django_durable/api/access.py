"""Who may call what: the project's permission classes, the admin's per-action permissions, a
queryset hook that scopes the runs a user sees, and throttles on the writing routes."""

from __future__ import annotations

from django.core.exceptions import ImproperlyConfigured
from django.utils.module_loading import import_string
from rest_framework.permissions import BasePermission, IsAdminUser
from rest_framework.throttling import SimpleRateThrottle

from .. import conf

APP = "django_durable"


def configured_permissions() -> list:
    """Instances of DURABLE_API_PERMISSION_CLASSES (classes or dotted paths)."""
    classes = conf.get("API_PERMISSION_CLASSES")
    if not classes:
        raise ImproperlyConfigured(
            "DURABLE_API_PERMISSION_CLASSES is empty: that would open the durable API to anyone. "
            "Use ['rest_framework.permissions.AllowAny'] if that is really what you want."
        )
    permissions = [(import_string(cls) if isinstance(cls, str) else cls)() for cls in classes]
    for permission in permissions:
        if type(permission) is IsAdminUser:  # DRF's own says only "You do not have permission ..."
            permission.message = STAFF_NEEDED
    return permissions


STAFF_NEEDED = ("This API needs a user with staff status (is_staff), as DURABLE_API_PERMISSION_CLASSES "
                "says (rest_framework.permissions.IsAdminUser).")


class ActionPermission(BasePermission):
    """The model permission of the view's action: the same custom permissions the admin uses."""

    message = "No permission is declared for this action, so nobody may call it."

    def has_permission(self, request, view):
        if view.action is None and request.method.lower() not in getattr(view, "action_map", {}):
            return True  # no action takes this method here: the view answers 405
        codename = view.required_permissions.get(view.action or "")
        if codename is None:
            return False  # an action without a declared permission is closed
        # DRF reads `message` after a refusal; this instance serves one request only.
        self.message = f"This needs the permission {APP}.{codename}, which you do not have."
        return bool(request.user and request.user.has_perm(f"{APP}.{codename}"))


def can_see_payloads(request) -> bool:
    return bool(request.user and request.user.has_perm(f"{APP}.view_payload_workflowrun"))


def scoped(request, queryset):
    """Apply DURABLE_API_QUERYSET_FILTER, if set."""
    hook = conf.get("API_QUERYSET_FILTER")
    if hook is None:
        return queryset
    if isinstance(hook, str):
        hook = import_string(hook)
    return hook(request, queryset)


class DurableThrottle(SimpleRateThrottle):
    """Per user (or client address) and per scope, at DURABLE_API_THROTTLE_RATES."""

    def __init__(self, scope: str):
        self.scope = scope
        super().__init__()

    def get_rate(self):
        return (conf.get("API_THROTTLE_RATES") or {}).get(self.scope)

    def get_cache_key(self, request, view):
        if self.rate is None:
            return None
        who = request.user.pk if request.user and request.user.is_authenticated else self.get_ident(request)
        return f"durable-throttle:{self.scope}:{who}"
