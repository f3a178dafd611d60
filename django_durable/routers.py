"""A database router that keeps every durable table on DURABLE_DATABASE.

With the durable tables on a database of their own, list it in the settings:

    DATABASES = {"default": {...}, "durable": {...}}
    DURABLE_DATABASE = "durable"
    DATABASE_ROUTERS = ["django_durable.routers.DurableRouter"]

Then ``migrate --database durable`` creates the durable tables there and nothing else, and
``migrate`` (the default database) creates none of them. The app's own queries name the alias
themselves; the router is for what Django does on its own: the admin's transactions, a model's
save() and delete(), and migrations. The system check django_durable.E008 says when it is missing.
"""

from __future__ import annotations

from . import conf

APP_LABEL = "django_durable"


class DurableRouter:
    """Reads, writes and migrations of django_durable's models go to DURABLE_DATABASE; that
    database migrates no other app's models unless it is also the default one. Other models
    get no opinion (None): the next router, or the default database, decides."""

    def db_for_read(self, model, **hints):
        return conf.get("DATABASE") if model._meta.app_label == APP_LABEL else None

    db_for_write = db_for_read

    def allow_relation(self, obj1, obj2, **hints):
        if obj1._meta.app_label == APP_LABEL and obj2._meta.app_label == APP_LABEL:
            return True
        return None

    def allow_migrate(self, db, app_label, model_name=None, **hints):
        alias = conf.get("DATABASE")
        if app_label == APP_LABEL:
            return db == alias
        if db == alias and alias != "default":
            return False
        return None
