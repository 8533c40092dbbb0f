"""README.md is the front page: the two fresh-machine commands come first. (That every method
of the contract is documented is tests/test_docs_generated.py's: each on its docs/ page.)"""

from pathlib import Path

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def test_readme_starts_with_the_two_fresh_machine_commands():
    head = README.split("## ", 1)[0]
    assert "python3 dev.py demo" in head and "python3 dev.py test" in head
