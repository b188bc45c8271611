"""MkDocs hook: pages whose single source lives outside docs/, added to the site as they are in the repository:
the README as the home page (its links to docs/ pages made relative to the site), RESULTS.md (generated from the
results JSON) and RELIABILITY.md (checked by the tests)."""
import re
from pathlib import Path

from mkdocs.structure.files import File

ROOT = Path(__file__).resolve().parents[2]
PAGES = {"results.md": ROOT / "benchmarks" / "RESULTS.md", "reliability.md": ROOT / "RELIABILITY.md"}


LINKS = {"benchmarks/RESULTS.md": "results.md", "RELIABILITY.md": "reliability.md"}


def home() -> str:
    """README.md with its links into docs/ and to the generated pages pointing at the site's pages."""
    text = (ROOT / "README.md").read_text()
    for old, new in LINKS.items():
        text = text.replace(f"]({old})", f"]({new})")
    return re.sub(r"\]\(docs/([^)]*)\)", r"](\1)", text)


def on_files(files, config):
    files.append(File.generated(config, "index.md", content=home()))
    for name, source in PAGES.items():
        files.append(File.generated(config, name, content=source.read_text()))
    return files
