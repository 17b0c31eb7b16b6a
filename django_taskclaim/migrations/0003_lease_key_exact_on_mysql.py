"""MySQL/MariaDB: compare lease keys byte for byte.

The default collations there are case- and accent-insensitive and ignore trailing spaces
(``PAD SPACE``), which made ``Report`` / ``report``, ``job`` / ``job `` and ``a`` / ``ä``
one lease. The ``key`` column gets a binary, ``NO PAD`` collation (MariaDB
``utf8mb4_nopad_bin``, MySQL 8 ``utf8mb4_0900_bin``). Other databases compare text
exactly already; nothing changes there. (Kept out of the model field's ``db_collation``,
which is one name for every vendor.)
"""

from __future__ import annotations

from typing import Any

from django.db import migrations


def _collation(connection: Any) -> str:
    if connection.mysql_is_mariadb:
        return "utf8mb4_nopad_bin"
    return "utf8mb4_0900_bin" if connection.mysql_version >= (8, 0) else "utf8mb4_bin"


def exact_keys(apps: Any, schema_editor: Any) -> None:
    connection = schema_editor.connection
    if connection.vendor != "mysql":
        return
    lease = apps.get_model("taskclaim", "Lease")
    qn = connection.ops.quote_name
    schema_editor.execute(
        f"ALTER TABLE {qn(lease._meta.db_table)} MODIFY {qn('key')} varchar(255) "
        f"CHARACTER SET utf8mb4 COLLATE {_collation(connection)} NOT NULL"
    )


class Migration(migrations.Migration):
    dependencies = [("taskclaim", "0002_utc_db_clock")]

    atomic = False  # MySQL cannot run DDL inside a transaction

    operations = [migrations.RunPython(exact_keys, migrations.RunPython.noop, atomic=False)]
