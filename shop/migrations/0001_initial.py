"""The demo shop's tables, moved here from the `runs` app.

State only: the tables `runs_shoporder`, `runs_replacement` and `runs_refund` were
created by runs/migrations/0001_initial.py and keep their names (`db_table`), so no
row moves; runs/migrations/0006_shop_models_moved.py drops them from `runs`' state.
"""

from decimal import Decimal

import django.db.models.deletion
from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies = [
        ("controlplane", "0007_idempotency_keys"),
        ("runs", "0005_run_enqueued_at_lease_worker"),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name="ShopOrder",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("order_id", models.CharField(max_length=4)),
                        ("customer", models.CharField(max_length=200)),
                        ("item", models.CharField(max_length=200)),
                        ("amount", models.DecimalField(decimal_places=2, max_digits=10)),
                        ("status", models.CharField(default="delivered", max_length=32)),
                        ("damaged", models.BooleanField(default=False)),
                        ("delivery_date", models.DateField(blank=True, null=True)),
                        ("tenant", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="controlplane.tenant")),
                    ],
                    options={"db_table": "runs_shoporder"},
                ),
                migrations.CreateModel(
                    name="Replacement",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("idempotency_key", models.CharField(max_length=64, unique=True)),
                        ("reason", models.CharField(max_length=500)),
                        ("delivery_date", models.DateField()),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("order", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="shop.shoporder")),
                    ],
                    options={"db_table": "runs_replacement"},
                ),
                migrations.CreateModel(
                    name="Refund",
                    fields=[
                        ("id", models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name="ID")),
                        ("amount", models.DecimalField(decimal_places=2, default=Decimal("0"), max_digits=10)),
                        ("reason", models.CharField(max_length=500)),
                        ("created_at", models.DateTimeField(auto_now_add=True)),
                        ("order", models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, to="shop.shoporder")),
                    ],
                    options={"db_table": "runs_refund"},
                ),
                migrations.AddConstraint(
                    model_name="shoporder",
                    constraint=models.UniqueConstraint(fields=("tenant", "order_id"), name="order_per_tenant"),
                ),
            ],
            database_operations=[],
        ),
    ]
