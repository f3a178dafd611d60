"""The engine: replay of workflow functions against their journal. No HTTP, no admin."""
