"""Every example the documentation marks as runnable is run by a test: the marked blocks of each
page are those its runner expects, so a new marked block without a test fails here."""

import re

from tests.conftest import ROOT

MARKER = re.compile(r"<!-- (example: (\S+)|runnable(: background)?)[^>]*-->")

# page -> (its runner, the names of its examples, or the number of its runnable blocks)
RUNNERS = {
    "guides": ("tests/test_guide.py", {"input", "switch", "notes", "describe", "describe-input", "fork", "gates", "fairness", "update", "stream", "live-stream", "agent", "agent-approval", "agent-openai", "agent-workflow-tool", "patched", "since", "approval",
                                         "subject", "view", "async"}),
    "telemetry.md": ("tests/test_telemetry.py", {"logging"}),
    "getting-started.md": ("tests/test_getting_started.py", 6),
}


def test_every_marked_example_in_the_docs_has_the_test_that_runs_it():
    found = {}
    for page in sorted((ROOT / "docs").glob("**/*.md")):
        markers = MARKER.findall(page.read_text())
        if markers:
            names = {name for _, name, _ in markers if name}
            key = page.parent.name if page.parent.name == "guides" else page.name
            if names and key in found:
                found[key] |= names
            else:
                found[key] = names or len(markers)
    assert found == {page: expected for page, (_, expected) in RUNNERS.items()}
    for runner, _ in RUNNERS.values():
        assert (ROOT / runner).exists(), runner
    assert "example: logging" in (ROOT / "tests" / "test_telemetry.py").read_text()


FILE_BLOCK = re.compile(r"<!-- file: (?P<name>\S+) -->\n```python\n(?P<body>.*?)```", re.S)


def test_the_pages_hold_the_code_the_runnable_docs_test_executes():
    """Issue 30: the repository host shows no `--8<--` include; each file a page shows is the file
    tests/test_getting_started.py puts in a new project, character for character."""
    for page in sorted((ROOT / "docs").glob("**/*.md")):
        assert "--8<--" not in page.read_text(), f"{page.name} includes a file the repository host will not show"
    page = (ROOT / "docs" / "getting-started.md").read_text()
    shown = {match["name"]: match["body"] for match in FILE_BLOCK.finditer(page)}
    files = sorted(str(path.relative_to(ROOT)) for path in (ROOT / "docs" / "getting_started").rglob("*.py"))
    assert sorted(shown) == files
    for name, body in shown.items():
        assert body == (ROOT / name).read_text(), f"docs/getting-started.md shows another {name}: copy the file in"
