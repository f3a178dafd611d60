# python manage.py shell < start.py   (or the same lines in a view, a signal receiver, a task)
import django_durable as durable

run = durable.start("shop.checkout", order_id=1, cents=1250)
print(run.id, run.status)
print(durable.wait(run.id, timeout=60))
