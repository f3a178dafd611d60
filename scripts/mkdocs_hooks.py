"""MkDocs hooks of the documentation site (mkdocs.yml): bench/RESULTS.md shown whole on the benchmarks page.

The page itself links to the file, which is what the repository host shows; the site puts the
file's text where the page's marker is, and leaves the link (to a file outside docs/) out.
"""

from pathlib import Path

MARKER = "<!-- the site shows bench/RESULTS.md here -->"


def on_page_markdown(markdown, page, config, files):
    if MARKER not in markdown:
        return markdown
    results = (Path(config["config_file_path"]).parent / "bench" / "RESULTS.md").read_text()
    kept = [line for line in markdown.splitlines() if "(../bench/RESULTS.md)" not in line]
    return "\n".join(kept).replace(MARKER, results)
