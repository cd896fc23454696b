# A calendar bucket is split into slot rows again, each with its share of the
# headroom (budgets/ledger.py: SLOTS). Existing rows become slot 0 with no
# division (`quota_limits` null): the next reservation in their bucket divides it
# under the budget's lock. No data moves.

from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('budgets', '0002_counters_one_per_bucket'),
        ('controlplane', '0008_budget_models_move_to_budgets'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='budgetcounter',
            name='one_budget_counter_per_bucket',
        ),
        migrations.AddField(
            model_name='budgetcounter',
            name='quota_cost',
            field=models.DecimalField(blank=True, decimal_places=6, max_digits=30, null=True),
        ),
        migrations.AddField(
            model_name='budgetcounter',
            name='quota_input_tokens',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='budgetcounter',
            name='quota_limits',
            field=models.JSONField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='budgetcounter',
            name='quota_output_tokens',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='budgetcounter',
            name='quota_runs',
            field=models.BigIntegerField(blank=True, null=True),
        ),
        migrations.AddField(
            model_name='budgetcounter',
            name='slot',
            field=models.PositiveSmallIntegerField(default=0),
        ),
        migrations.AddConstraint(
            model_name='budgetcounter',
            constraint=models.UniqueConstraint(fields=('tenant', 'period', 'bucket_start', 'slot'), name='one_budget_counter_per_bucket_slot'),
        ),
    ]
