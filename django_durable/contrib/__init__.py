"""Integrations with other libraries, each an optional extra (``pip install "django-durable-workflows[pydantic-ai]"``)."""
