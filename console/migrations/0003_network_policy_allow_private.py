"""Private CIDRs also allowed, and the meaning of the lists turned round (issue 13).

Before: allow entries beat deny entries, and an allow list took effect only beside a deny-all
entry. Now: a non-empty allow list alone lets out only its entries, and deny entries win. A
stored "deny 0.0.0.0/0 and ::/0 + allow list" (the old way to say "only these") would now
refuse everything, so those deny-all entries are dropped: the allow list keeps its meaning.
"""

from django.db import migrations, models

DENY_ALL = {"0.0.0.0/0", "::/0"}


def keep_allow_only_policies(apps, schema_editor):
    NetworkPolicy = apps.get_model("console", "NetworkPolicy")
    for policy in NetworkPolicy.objects.exclude(allow_out=[]):
        if DENY_ALL & set(policy.deny_out):
            policy.deny_out = [entry for entry in policy.deny_out if entry not in DENY_ALL]
            policy.save(update_fields=["deny_out"])


class Migration(migrations.Migration):
    dependencies = [("console", "0002_space_limits")]

    operations = [
        migrations.AddField(
            model_name="networkpolicy",
            name="allow_private",
            field=models.JSONField(blank=True, default=list),
        ),
        migrations.RunPython(keep_allow_only_policies, migrations.RunPython.noop),
    ]
