"""A tiny shop: orders that the example workflows fulfil."""

from django.db import models


# What the shop sells: sku -> (name, price).
PRODUCTS = {
    "mug": ("Durable mug", "12.50"),
    "tee": ("Checkpoint T-shirt", "24.00"),
    "poster": ("Replay poster", "9.90"),
}


class Order(models.Model):
    customer = models.CharField(max_length=100)
    total = models.DecimalField(max_digits=10, decimal_places=2)
    status = models.CharField(max_length=20, default="new")
    created_at = models.DateTimeField(auto_now_add=True)
    product = models.CharField(max_length=20, blank=True, default="")
    quantity = models.PositiveIntegerField(default=1)
    # The demo's card: "ok", or "declined" to see the saga undo the reservation.
    card = models.CharField(max_length=20, default="ok")

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


class SentEmail(models.Model):
    """The shop's outbox: what the send_email task (django.tasks, on the durable workers) sent."""

    order = models.ForeignKey(Order, null=True, on_delete=models.SET_NULL)
    to = models.CharField(max_length=200)
    subject = models.CharField(max_length=200)
    body = models.TextField()
    sent_at = models.DateTimeField(auto_now_add=True)
