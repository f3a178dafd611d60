# Added at the end of mysite/settings.py (the file startproject made).
INSTALLED_APPS += ["django_durable", "shop"]

# SQLite, as startproject set it up, with the two options the workers need: a write
# transaction takes the lock when it begins, and readers do not block the writer.
DATABASES["default"]["OPTIONS"] = {
    "transaction_mode": "IMMEDIATE",
    "init_command": "PRAGMA journal_mode=WAL;",
}
