"""The engine: replay of workflow functions against their journal.

No HTTP, no admin, nothing from services/ or tasks.py: what the engine shares with those (a run
created or ended, a message delivered, an approval opened) sits below it (tests/test_layers.py).
"""
