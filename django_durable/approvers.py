"""Who may decide an approval, and the approval a run waits for, stored when it begins to wait.

Below both the engine (``ctx.wait_for_approval()`` opens one, describe() checks its approvers)
and the services (deciding it, the inbox): services/approvals.py holds the rest.
"""

from __future__ import annotations

from typing import Any

from django.apps import apps
from django.contrib.auth.models import Group, Permission

from . import serialization
from .models import Approval


def approvers_spec(approvers) -> dict[str, Any]:
    """Who may decide, as stored: {"permission": "app.codename"}, {"group": name} or {"users": [pk, ...]}.

    `approvers` is a permission (``"orders.approve_refund"``), a Group or ``{"group": name}``, a
    list of users or user primary keys, or one of the stored dicts. ValueError otherwise.
    """
    if isinstance(approvers, str):
        if approvers.count(".") != 1 or not all(approvers.split(".")):
            raise ValueError(f"approvers={approvers!r}: a permission is written 'app_label.codename'.")
        return {"permission": approvers}
    if isinstance(approvers, Group):
        return {"group": approvers.name}
    if isinstance(approvers, dict) and len(approvers) == 1:
        (kind, value), = approvers.items()
        if kind == "permission":
            return approvers_spec(value)
        if kind == "group" and isinstance(value, str) and value:
            return {"group": value}
        if kind == "users":
            return approvers_spec(list(value))
    if isinstance(approvers, list | tuple) and approvers:
        users = [getattr(user, "pk", user) for user in approvers]
        if all(isinstance(pk, int | str) and not isinstance(pk, bool) for pk in users):
            return {"users": sorted({str(pk) for pk in users})}
    raise ValueError(
        f"approvers={approvers!r}: give a permission ('app_label.codename'), a Group or {{'group': name}}, "
        f"or a non-empty list of users or their primary keys."
    )


def declared_permission(permission: str) -> bool:
    """Whether a model of an installed app declares `permission` ("app_label.codename"): one of its
    default permissions, or one of its Meta.permissions. Read from the code, not the database."""
    app_label, _, codename = permission.partition(".")
    try:
        models = apps.get_app_config(app_label).get_models()
    except LookupError:
        return False
    for model in models:
        opts = model._meta
        if codename in {f"{action}_{opts.model_name}" for action in opts.default_permissions} or \
                codename in {name for name, _ in opts.permissions}:
            return True
    return False


def check_approvers(spec: dict) -> None:
    """Raise ValueError naming the permission or group of `spec` that does not exist: an approval
    asked of nobody would wait for ever, seen in no inbox (or only in superusers')."""
    permission, group = spec.get("permission"), spec.get("group")
    if permission and not declared_permission(permission):
        app_label, _, codename = permission.partition(".")
        if not Permission.objects.filter(content_type__app_label=app_label, codename=codename).exists():
            raise ValueError(f"approvers={permission!r}: no such permission exists (no model declares it and "
                             f"the database has none), so nobody but a superuser could decide. Check the "
                             f"spelling, or declare it in a model's Meta.permissions.")
    if group and not Group.objects.filter(name=group).exists():
        raise ValueError(f"approvers={{'group': {group!r}}}: no group {group!r} exists, so nobody could decide. "
                         f"Create the group (the admin's Groups, or a data migration) first.")


def open_approval(run_id, key: str, spec: dict, quorum: int, message: str, data: str, deadline, db: str) -> None:
    """Store the approval the run `run_id` waits for at `key` (once: a replay changes nothing).

    ValueError if its permission or group does not exist (check_approvers)."""
    check_approvers(spec)
    Approval.objects.using(db).bulk_create([Approval(
        run_id=run_id, key=key, permission=spec.get("permission", ""), group=spec.get("group", ""),
        users=spec.get("users", []), quorum=quorum, message=message, data=serialization.display(data) or {},
        deadline_at=deadline,
    )], ignore_conflicts=True)
