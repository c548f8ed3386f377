"""The sessions list's indexes: the migration that adds them builds exactly the model's."""

from __future__ import annotations

from importlib import import_module

from django.db import migrations

from sandboxes.models import Session


def test_the_migration_adds_the_models_three_list_indexes_unchanged() -> None:
    migration = import_module("sandboxes.migrations.0021_session_list_indexes").Migration
    added = {
        operation.index.name: operation.index.deconstruct()
        for operation in migration.operations
        if isinstance(operation, migrations.AddIndex)
    }
    model = {
        index.name: index.deconstruct() for index in Session._meta.indexes if index.name.startswith("session_list")
    }
    assert set(added) == {"session_list_order", "session_list_space_order", "session_list_state_order"}
    assert added == model
