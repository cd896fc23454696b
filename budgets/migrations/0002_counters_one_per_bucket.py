# The ledger reserves under the budget row's lock: a bucket is one counter row,
# no longer split into escrow slots with quotas (nor versioned by the budget).

from django.db import migrations, models

SUMMED = [
    f"{state}_{name}"
    for state in ("used", "reserved")
    for name in ("input_tokens", "output_tokens", "cost", "runs")
]


def merge_slots(apps, schema_editor):
    """Each bucket's slot rows become one row holding their sums; ledger entries
    that may still settle (reserved, or released and settled late) point at it."""
    counter = apps.get_model("budgets", "BudgetCounter")
    entry = apps.get_model("budgets", "BudgetLedgerEntry")
    buckets = {}
    for row in counter.objects.order_by("id").iterator():
        key = (row.tenant_id, row.period, row.bucket_start)
        buckets.setdefault(key, []).append(row)
    merged_into = {}
    for rows in buckets.values():
        if len(rows) == 1:
            continue
        kept, rest = rows[0], rows[1:]
        for field in SUMMED:
            setattr(kept, field, sum(getattr(row, field) for row in rows))
        kept.save(update_fields=SUMMED)
        counter.objects.filter(id__in=[row.id for row in rest]).delete()
        merged_into.update({row.id: kept.id for row in rest})
    if not merged_into:
        return
    for row in entry.objects.filter(status__in=["reserved", "released"]).iterator():
        ids = [merged_into.get(old, old) for old in row.counter_ids]
        if ids != row.counter_ids:
            entry.objects.filter(id=row.id).update(counter_ids=ids)


class Migration(migrations.Migration):

    dependencies = [
        ('budgets', '0001_initial'),
        ('controlplane', '0008_budget_models_move_to_budgets'),
    ]

    operations = [
        migrations.RemoveConstraint(
            model_name='budgetcounter',
            name='one_budget_counter_per_bucket_slot',
        ),
        migrations.RunPython(merge_slots, migrations.RunPython.noop),
        migrations.RemoveField(
            model_name='budget',
            name='version',
        ),
        migrations.RemoveField(
            model_name='budgetcounter',
            name='limits_version',
        ),
        migrations.RemoveField(
            model_name='budgetcounter',
            name='quota_cost',
        ),
        migrations.RemoveField(
            model_name='budgetcounter',
            name='quota_input_tokens',
        ),
        migrations.RemoveField(
            model_name='budgetcounter',
            name='quota_output_tokens',
        ),
        migrations.RemoveField(
            model_name='budgetcounter',
            name='quota_runs',
        ),
        migrations.RemoveField(
            model_name='budgetcounter',
            name='slot',
        ),
        migrations.AddConstraint(
            model_name='budgetcounter',
            constraint=models.UniqueConstraint(fields=('tenant', 'period', 'bucket_start'), name='one_budget_counter_per_bucket'),
        ),
    ]
