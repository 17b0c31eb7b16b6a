"""``testapp``'s migrations as they stood before ``claimed_at`` was added to the mixin
(0001 to 0004, the same files): with ``MIGRATION_MODULES = {"testapp": this package}``
a project looks as it does right after an upgrade that added a field, before
``makemigrations`` (tests/worker/test_upgrade_fixes.py)."""
