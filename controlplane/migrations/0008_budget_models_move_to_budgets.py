# The budget models move to the budgets app (budgets 0001): state only, the
# tables keep their names and their rows.

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('controlplane', '0007_idempotency_keys'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name='Budget'),
                migrations.DeleteModel(name='BudgetCounter'),
                migrations.DeleteModel(name='BudgetGrant'),
                migrations.DeleteModel(name='BudgetLedgerEntry'),
                migrations.DeleteModel(name='ModelPriceEntry'),
            ],
            database_operations=[],
        ),
    ]
