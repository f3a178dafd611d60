"""The approval inbox: what the logged-in user may decide, each with its context, approved or
rejected with a comment; and the page an e-mailed approval link opens."""

from __future__ import annotations

from django.contrib import admin, messages
from django.core.exceptions import PermissionDenied
from django.http import HttpResponseRedirect
from django.shortcuts import get_object_or_404
from django.template.response import TemplateResponse
from django.urls import path, reverse

from .. import conf, serialization
from ..exceptions import DurableError
from ..models import Approval, ApprovalDecision
from ..services import approvals
from .base import DurableAdmin


@admin.register(Approval)
class ApprovalAdmin(DurableAdmin):
    """Seen by every staff user; each sees only the approvals they may decide (services.approvals)."""

    def has_module_permission(self, request):
        return request.user.is_active and request.user.is_staff

    def has_view_permission(self, request, obj=None):
        return request.user.is_active and request.user.is_staff

    def has_delete_permission(self, request, obj=None):
        return False

    def get_urls(self):
        name = f"{self.opts.app_label}_{self.opts.model_name}"
        view = self.admin_site.admin_view
        return [
            path("", view(self.changelist_view), name=f"{name}_changelist"),
            path("link/<str:token>/", view(self.link_view), name=f"{name}_link"),
            path("<int:pk>/", view(self.decide_view), name=f"{name}_change"),
        ]

    def changelist_view(self, request, extra_context=None):
        self._check(request)
        inbox = approvals.approvals_for(request.user)
        return TemplateResponse(request, "admin/django_durable/approval/inbox.html", self.page_context(
            request, "Approvals waiting for you", inbox=inbox,
            may_see_runs=request.user.has_perm("django_durable.view_workflowrun")))

    def decide_view(self, request, pk):
        self._check(request)
        approval = get_object_or_404(Approval.objects.using(conf.get("DATABASE")).select_related("run"), pk=pk)
        return self._decide(request, approval, link=None)

    def link_view(self, request, token):
        self._check(request)
        try:
            approval, nonce = approvals.read_link(token, request.user)
        except approvals.InvalidLink as refused:
            return TemplateResponse(request, "admin/django_durable/approval/decide.html", self.page_context(
                request, "Approval link", refused=str(refused)), status=400)
        return self._decide(request, approval, link=nonce)

    def _decide(self, request, approval: Approval, *, link):
        may = approvals.may_decide(request.user, approval)
        if not may and not request.user.has_perm("django_durable.view_workflowrun"):
            raise PermissionDenied  # neither an approver nor an operator: nothing to see here
        if request.method == "POST":
            decision = request.POST.get("decision")
            if decision not in ("approve", "reject"):
                messages.error(request, "Choose Approve or Reject.")
            else:
                try:
                    approvals.decide(approval.run_id, approval.key, request.user, approve=decision == "approve",
                                     comment=request.POST.get("comment", ""), link=link)
                except (PermissionDenied, DurableError) as refused:
                    messages.error(request, str(refused) or "You may not decide this approval.")
                    return HttpResponseRedirect(request.path)
                messages.success(request, f"{'Approved' if decision == 'approve' else 'Rejected'}: "
                                          f"{approval.message or approval.key}.")
                return HttpResponseRedirect(reverse(f"{self.admin_site.name}:django_durable_approval_changelist"))
        decisions = list(ApprovalDecision.objects.using(conf.get("DATABASE")).filter(approval=approval))
        decided = any(d.user_id == request.user.pk for d in decisions)
        return TemplateResponse(request, "admin/django_durable/approval/decide.html", self.page_context(
            request, approval.message or f"Approval {approval.key}", approval=approval, decisions=decisions,
            data=serialization.dumps(approval.data, indent=2) if approval.data else "",
            may_decide=may and not decided and approval.status == Approval.Status.PENDING, decided=decided,
            run_url=reverse(f"{self.admin_site.name}:django_durable_workflowrun_change",
                                         args=[approval.run_id])))

    def _check(self, request) -> None:
        if not self.has_view_permission(request):
            raise PermissionDenied
