"""README documents every method of the contract (so a new method cannot go undocumented)."""

from pathlib import Path

from protocol import METHODS, NOTIFICATIONS

README = (Path(__file__).resolve().parent.parent / "README.md").read_text(encoding="utf-8")


def test_every_method_and_notification_is_in_the_readme():
    missing = [name for name in [*METHODS, *NOTIFICATIONS] if f"`{name}`" not in README]
    assert not missing, f"README.md does not document: {missing}"


def test_readme_starts_with_the_two_fresh_machine_commands():
    head = README.split("## ", 1)[0]
    assert "python3 dev.py demo" in head and "python3 dev.py test" in head
