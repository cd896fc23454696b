# The budget models move here from the controlplane app: state only, the tables
# keep their names (db_table) and their rows.

import budgets.models
import django.db.models.deletion
from decimal import Decimal
from django.db import migrations, models


class Migration(migrations.Migration):

    initial = True

    dependencies = [
        ('controlplane', '0008_budget_models_move_to_budgets'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.CreateModel(
                    name='Budget',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('period_mode', models.CharField(choices=[('calendar', 'Calendar'), ('rolling', 'Rolling')], default='calendar', max_length=16)),
                        ('period_limits', models.JSONField(default=dict)),
                        ('run_caps', models.JSONField(default=dict)),
                        ('max_concurrent_runs', models.PositiveIntegerField(blank=True, null=True)),
                        ('allow_unknown_price', models.BooleanField(default=False)),
                        ('on_exhausted', models.CharField(choices=[('stop', 'Stop'), ('ask', 'Ask')], default='stop', max_length=8)),
                        ('extend_by', models.JSONField(blank=True, default=dict)),
                        ('version', models.PositiveIntegerField(default=0)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('tenant', models.OneToOneField(on_delete=django.db.models.deletion.CASCADE, related_name='budget', to='controlplane.tenant')),
                    ],
                    options={
                        'db_table': 'controlplane_budget',
                    },
                ),
                migrations.CreateModel(
                    name='BudgetLedgerEntry',
                    fields=[
                        ('id', models.UUIDField(default=budgets.models.time_ordered_uuid, editable=False, primary_key=True, serialize=False)),
                        ('run_id', models.UUIDField(db_index=True)),
                        ('step_index', models.IntegerField(blank=True, null=True)),
                        ('call_id', models.CharField(blank=True, max_length=128)),
                        ('kind', models.CharField(choices=[('model_call', 'Model Call'), ('tool_call', 'Tool Call'), ('run', 'Run')], max_length=16)),
                        ('status', models.CharField(choices=[('reserved', 'Reserved'), ('settled', 'Settled'), ('released', 'Released')], default='reserved', max_length=16)),
                        ('reserved', models.JSONField(default=dict)),
                        ('actual', models.JSONField(blank=True, null=True)),
                        ('counter_ids', models.JSONField(default=list)),
                        ('funding', models.JSONField(blank=True, default=list)),
                        ('created_at', models.DateTimeField(auto_now_add=True)),
                        ('settled_at', models.DateTimeField(blank=True, null=True)),
                        ('tenant', models.ForeignKey(db_constraint=False, db_index=False, on_delete=django.db.models.deletion.CASCADE, related_name='budget_ledger', to='controlplane.tenant')),
                    ],
                    options={
                        'db_table': 'controlplane_budgetledgerentry',
                    },
                ),
                migrations.CreateModel(
                    name='BudgetCounter',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('period', models.CharField(max_length=8)),
                        ('bucket_start', models.DateTimeField()),
                        ('slot', models.PositiveSmallIntegerField(default=0)),
                        ('used_input_tokens', models.BigIntegerField(default=0)),
                        ('reserved_input_tokens', models.BigIntegerField(default=0)),
                        ('used_output_tokens', models.BigIntegerField(default=0)),
                        ('reserved_output_tokens', models.BigIntegerField(default=0)),
                        ('used_cost', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=18)),
                        ('reserved_cost', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=18)),
                        ('used_runs', models.BigIntegerField(default=0)),
                        ('reserved_runs', models.BigIntegerField(default=0)),
                        ('quota_input_tokens', models.BigIntegerField(blank=True, null=True)),
                        ('quota_output_tokens', models.BigIntegerField(blank=True, null=True)),
                        ('quota_cost', models.DecimalField(blank=True, decimal_places=6, max_digits=18, null=True)),
                        ('quota_runs', models.BigIntegerField(blank=True, null=True)),
                        ('limits_version', models.PositiveIntegerField(default=0)),
                        ('tenant', models.ForeignKey(on_delete=django.db.models.deletion.CASCADE, related_name='budget_counters', to='controlplane.tenant')),
                    ],
                    options={
                        'db_table': 'controlplane_budgetcounter',
                        'constraints': [models.UniqueConstraint(fields=('tenant', 'period', 'bucket_start', 'slot'), name='one_budget_counter_per_bucket_slot')],
                    },
                ),
                migrations.CreateModel(
                    name='BudgetGrant',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('run_id', models.UUIDField()),
                        ('period', models.CharField(max_length=8)),
                        ('bucket_start', models.DateTimeField()),
                        ('dimension', models.CharField(max_length=16)),
                        ('amount', models.DecimalField(decimal_places=6, max_digits=18)),
                        ('used', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=18)),
                        ('reserved', models.DecimalField(decimal_places=6, default=Decimal('0'), max_digits=18)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('tenant', models.ForeignKey(db_constraint=False, on_delete=django.db.models.deletion.CASCADE, related_name='budget_grants', to='controlplane.tenant')),
                    ],
                    options={
                        'db_table': 'controlplane_budgetgrant',
                        'constraints': [models.UniqueConstraint(fields=('run_id', 'period', 'bucket_start', 'dimension'), name='one_budget_grant_per_run_bucket_dimension')],
                    },
                ),
                migrations.CreateModel(
                    name='ModelPriceEntry',
                    fields=[
                        ('id', models.BigAutoField(auto_created=True, primary_key=True, serialize=False, verbose_name='ID')),
                        ('model', models.CharField(max_length=200)),
                        ('input_per_million', models.DecimalField(decimal_places=6, max_digits=12)),
                        ('cached_input_per_million', models.DecimalField(decimal_places=6, max_digits=12)),
                        ('output_per_million', models.DecimalField(decimal_places=6, max_digits=12)),
                        ('updated_at', models.DateTimeField(auto_now=True)),
                        ('tenant', models.ForeignKey(blank=True, null=True, on_delete=django.db.models.deletion.CASCADE, related_name='model_prices', to='controlplane.tenant')),
                    ],
                    options={
                        'db_table': 'controlplane_modelpriceentry',
                        'constraints': [models.UniqueConstraint(fields=('tenant', 'model'), name='one_price_per_model_and_tenant')],
                    },
                ),
            ],
            database_operations=[],
        ),
    ]
