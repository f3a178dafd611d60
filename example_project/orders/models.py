"""A tiny shop: orders that the example workflows fulfil."""

from django.db import models


class Order(models.Model):
    customer = models.CharField(max_length=100)
    total = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=20, default="new")
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        # Who may approve a refund (orders.approve_refund waits for one of them).
        permissions = [("approve_refund", "Can approve refunds")]

    def __str__(self):
        return f"Order {self.pk} for {self.customer} ({self.status})"


class Payment(models.Model):
    """Written by an atomic step: exactly one per charged order, even across crashes."""

    order = models.OneToOneField(Order, on_delete=models.CASCADE)
    amount = models.DecimalField(max_digits=10, decimal_places=2)
    reference = models.CharField(max_length=64)
