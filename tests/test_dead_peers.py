"""A worker process's PostgreSQL connections notice a database gone silent: the TCP settings of
workpool/listening.py (keepalives, tcp_user_timeout, connect_timeout) on every PostgreSQL alias,
where the project's OPTIONS do not set them. The cut itself: tests/harness/partition.py."""

from __future__ import annotations

import copy

import pytest
from django.db import connection
from django.db.utils import ConnectionHandler

from django_durable.worker import connection as worker_connection
from django_durable.workpool.listening import TCP_SETTINGS


def handler(databases: dict, monkeypatch) -> ConnectionHandler:
    connections = ConnectionHandler(databases)
    monkeypatch.setattr(worker_connection, "connections", connections)
    return connections


def test_every_postgresql_alias_gets_the_settings_its_options_do_not_set(monkeypatch):
    connections = handler({
        "default": {"ENGINE": "django.db.backends.postgresql", "NAME": "shop",
                    "OPTIONS": {"connect_timeout": 3, "tcp_user_timeout": 0}},
        "reports": {"ENGINE": "django.db.backends.postgresql", "NAME": "reports"},
        "cache": {"ENGINE": "django.db.backends.sqlite3", "NAME": ":memory:"},
    }, monkeypatch)

    assert worker_connection.find_dead_peers() == ["default", "reports"]

    assert connections.settings["default"]["OPTIONS"] == {**TCP_SETTINGS, "connect_timeout": 3, "tcp_user_timeout": 0}
    assert connections.settings["reports"]["OPTIONS"] == TCP_SETTINGS
    assert connections.settings["cache"]["OPTIONS"] == {}
    params = connections["reports"].get_connection_params()
    assert {name: params[name] for name in TCP_SETTINGS} == TCP_SETTINGS
    assert worker_connection.find_dead_peers() == []  # (once is enough)


@pytest.mark.postgres
@pytest.mark.django_db
def test_a_connection_opened_after_carries_them_to_libpq(monkeypatch):
    connections = handler({"default": copy.deepcopy(connection.settings_dict)}, monkeypatch)
    connections.settings["default"]["OPTIONS"].pop("tcp_user_timeout", None)
    worker_connection.find_dead_peers()
    try:
        connections["default"].ensure_connection()
        told = connections["default"].connection.info.get_parameters()
    finally:
        connections.close_all()
    assert (told["tcp_user_timeout"], told["keepalives_idle"], told["connect_timeout"]) == ("15000", "5", "5")
