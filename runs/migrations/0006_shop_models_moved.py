"""The demo shop's models now live in the `shop` app (shop/migrations/0001_initial.py).

State only: the tables stay where they are, now owned by `shop`.
"""

from django.db import migrations


class Migration(migrations.Migration):
    dependencies = [
        ("runs", "0005_run_enqueued_at_lease_worker"),
        ("shop", "0001_initial"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name="Refund"),
                migrations.DeleteModel(name="Replacement"),
                migrations.DeleteModel(name="ShopOrder"),
            ],
            database_operations=[],
        ),
    ]
