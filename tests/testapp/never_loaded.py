"""A module only tests/test_determinism.py names, inside a workflow's body: the determinism check
must not import it."""


def answer():
    return 42
