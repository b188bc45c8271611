"""The documentation's own rules: benchmarks/logs holds at most a dozen logs, each cited by a page of the guide
(docs/, RELIABILITY.md) as evidence of a current figure; every page the site builds is in its navigation."""
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def pages() -> str:
    return "\n".join(p.read_text() for p in [*ROOT.joinpath("docs").rglob("*.md"), ROOT / "RELIABILITY.md"])


def test_logs_are_few_and_each_cited():
    logs = sorted(p.name for p in (ROOT / "benchmarks" / "logs").iterdir())
    assert len(logs) <= 12, logs
    text = pages()
    assert [name for name in logs if name not in text] == []


def test_every_docs_page_is_in_the_nav():
    nav = (ROOT / "mkdocs.yml").read_text()
    docs = ROOT / "docs"
    missing = [str(p.relative_to(docs)) for p in docs.rglob("*.md")
               if "hooks" not in p.parts and f": {p.relative_to(docs).as_posix()}" not in nav]
    assert missing == []


def test_design_pages_hold_the_present():
    """A design page says how it works now, what limits it, what was tried and what is next, in at most 300 lines:
    its history is in git."""
    long = {p.name: n for p in (ROOT / "docs" / "design").glob("*.md")
            if (n := len(p.read_text().splitlines())) > 300}
    assert long == {}
