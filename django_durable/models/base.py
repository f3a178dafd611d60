"""What every durable model shares: its manager, which reads and writes DURABLE_DATABASE."""

from __future__ import annotations

from django.db import models
from django.db.models.base import ModelState
from django.db.models.signals import post_init, pre_init

from .. import conf


class DurableManager(models.Manager):
    """Every durable model's manager: its querysets use DURABLE_DATABASE unless told otherwise
    (.using(), db_manager()), so the admin, the API and project code reading the durable tables
    find them on their own database, with or without django_durable.routers.DurableRouter."""

    def get_queryset(self):
        return self._queryset_class(model=self.model, using=self._db or conf.get("DATABASE"), hints=self._hints)


def unsaved(model: type[models.Model], **values):
    """`model(**values)` for a hot path (a start): the same unsaved instance, every field not
    given at its default, without Model.__init__'s work for each field (a fifth of a start's CPU).

    `values` are attribute names (``parent_id``, not ``parent``). The fields whose default is
    made at each call (a callable) get a fresh one; the others share the template's, all
    immutable (the models this serves have no mutable default: a test checks). A database
    default is one DatabaseDefault for every instance, as Django 6's fields keep it: the insert
    resolves it into a new expression and the saved row's value replaces it.
    Where a receiver listens to the model's pre_init or post_init, it is Model.__init__.
    """
    shape = _shapes.get(model)
    if shape is None:
        shape = _shapes[model] = _shape(model)
    template, made, names = shape
    if not names.issuperset(values):
        raise TypeError(f"{model.__name__} has no field {', '.join(sorted(set(values) - names))}.")
    if pre_init.has_listeners(model) or post_init.has_listeners(model):
        return model(**values)
    instance = model.__new__(model)
    state = instance.__dict__
    state.update(template)
    for name, field in made:
        if name not in values:
            state[name] = field.get_default()
    state.update(values)
    state["_state"] = ModelState()
    return instance


def _shape(model: type[models.Model]) -> tuple[dict, list, frozenset]:
    """What unsaved() copies for `model`: a blank instance's values, the fields whose default is
    made at each call, and every attribute name a value may be given for."""
    blank = model().__dict__
    blank.pop("_state")
    fields = model._meta.concrete_fields
    made = [(field.attname, field) for field in fields if field.has_default() and callable(field.default)]
    return blank, made, frozenset(field.attname for field in fields)


_shapes: dict[type, tuple[dict, list, frozenset]] = {}
