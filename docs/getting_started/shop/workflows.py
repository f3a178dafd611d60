# shop/workflows.py: found at start-up, like admin.py.
import django_durable as durable


def reserve(order_id):
    return {"order": order_id, "reserved": True}


def charge(order_id, cents):
    return {"order": order_id, "charged": cents}


def send_receipt(order_id, payment):
    return f"Receipt for order {order_id}: {payment['charged'] / 100:.2f} paid."


@durable.workflow("shop.checkout")
def checkout(ctx: durable.Context, order_id: int, cents: int) -> dict:
    ctx.step("reserve", reserve, order_id)
    payment = ctx.step("charge", charge, order_id, cents)
    ctx.sleep("cooling-off", 10)  # durable: no worker is held while the run waits
    receipt = ctx.step("receipt", send_receipt, order_id, payment)
    return {"order": order_id, "receipt": receipt}
