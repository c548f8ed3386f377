"""Platform-owned backends: the infrastructure moves from each config to a PlatformBackend.

One backend per distinct infrastructure tuple of the existing configs (kind, endpoint,
domain, data-plane URL, key, private opt-in, host root, package sources), granted to the
spaces whose configs used it. The key moves to the backend, so `config_fingerprint` (kind,
endpoint, domain, key) is unchanged and recorded skill images stay valid. Reversible.

Not atomic as a whole: PostgreSQL refuses to alter a table with pending deferred FK checks
from the rows the data step just wrote; the data step itself runs in one transaction.
"""

import uuid

import django.core.validators
import django.db.models.deletion
from django.db import migrations, models

INFRA_FIELDS = (
    "kind",
    "endpoint",
    "domain",
    "sandbox_url",
    "allow_private_endpoints",
    "workspace_host_root",
    "pip_index_url",
    "pip_find_links",
    "npm_registry_url",
)
DEFAULT_LIMITS = {"max_cpus": 4, "max_memory_mb": 8192, "max_pids": 4096}


def _plain_key(token):
    from console.crypto import SecretUnreadable, decrypt

    try:
        return decrypt(token)
    except SecretUnreadable:
        return "unreadable:" + token  # kept as stored; grouped only with the very same token


def _backend_name(PlatformBackend, values):
    where = values["endpoint"] or ("local socket" if values["kind"] == "docker" else "no endpoint")
    base = f"{values['kind']} {where}"[:90]
    name, n = base, 1
    while PlatformBackend.objects.filter(name=name).exists():
        n += 1
        name = f"{base} ({n})"
    return name


def create_platform_backends(apps, schema_editor):
    """One platform backend per distinct infrastructure tuple, granted to its configs' spaces."""
    SandboxConfig = apps.get_model("sandboxes", "SandboxConfig")
    PlatformBackend = apps.get_model("sandboxes", "PlatformBackend")
    made = {}
    for config in SandboxConfig.objects.order_by("created", "id"):
        values = {field: getattr(config, field) for field in INFRA_FIELDS}
        identity = (*values.values(), _plain_key(config.api_key_encrypted))
        backend = made.get(identity)
        if backend is None:
            backend = PlatformBackend.objects.create(
                id=uuid.uuid4(),
                name=_backend_name(PlatformBackend, values),
                api_key_encrypted=config.api_key_encrypted,
                **values,
                **DEFAULT_LIMITS,
            )
            made[identity] = backend
        # Limits never below what an existing config already gives its sandboxes.
        raised = {
            "max_cpus": max(backend.max_cpus, config.cpus),
            "max_memory_mb": max(backend.max_memory_mb, config.memory_mb),
            "max_pids": max(backend.max_pids, config.pids_limit),
        }
        if any(getattr(backend, k) != v for k, v in raised.items()):
            for k, v in raised.items():
                setattr(backend, k, v)
            backend.save(update_fields=list(raised))
        backend.spaces.add(config.space_id)
        config.backend_id = backend.id
        config.api_key_encrypted = ""
        config.save(update_fields=["backend", "api_key_encrypted"])


def restore_config_infrastructure(apps, schema_editor):
    """Back: each config gets its backend's infrastructure (and key, unless it has its own)."""
    SandboxConfig = apps.get_model("sandboxes", "SandboxConfig")
    for config in SandboxConfig.objects.select_related("backend"):
        for field in INFRA_FIELDS:
            setattr(config, field, getattr(config.backend, field))
        # The key it uses (sandboxes.catalog.bridge.effective_api_key): its own only where allowed.
        own = config.api_key_encrypted if config.backend.allow_space_api_key else ""
        config.api_key_encrypted = own or config.backend.api_key_encrypted
        config.save(update_fields=[*INFRA_FIELDS, "api_key_encrypted"])


class Migration(migrations.Migration):
    atomic = False

    dependencies = [
        ("console", "0001_initial"),
        ("sandboxes", "0010_session_store"),
    ]

    operations = [
        migrations.CreateModel(
            name="PlatformBackend",
            fields=[
                ("id", models.UUIDField(default=uuid.uuid4, editable=False, primary_key=True, serialize=False)),
                ("name", models.CharField(max_length=100, unique=True)),
                (
                    "kind",
                    models.CharField(
                        choices=[("docker", "Docker"), ("e2b", "E2B"), ("cube", "Cube Sandbox")],
                        default="docker",
                        max_length=16,
                    ),
                ),
                (
                    "endpoint",
                    models.CharField(
                        blank=True,
                        help_text="E2B/Cube: the control-plane URL (https://api.example.com). Docker: empty for the "
                        "local engine socket, unix:///path, tcp://host:port (with TLS client certificates) or "
                        "ssh://user@host.",
                        max_length=500,
                    ),
                ),
                (
                    "domain",
                    models.CharField(
                        blank=True, help_text="E2B/Cube: the sandbox (data-plane) domain.", max_length=255
                    ),
                ),
                (
                    "sandbox_url",
                    models.CharField(
                        blank=True,
                        help_text="E2B/Cube, optional: one data-plane (envd) URL for every sandbox, routed by header "
                        "(a Cube proxy, or a test server). Empty: https://49983-<sandbox>.<domain>.",
                        max_length=500,
                    ),
                ),
                ("api_key_encrypted", models.TextField(blank=True)),
                ("tls_ca_encrypted", models.TextField(blank=True)),
                ("tls_cert_encrypted", models.TextField(blank=True)),
                ("tls_key_encrypted", models.TextField(blank=True)),
                (
                    "allow_private_endpoints",
                    models.BooleanField(
                        default=False,
                        help_text="Allow the endpoint to resolve to loopback, private or 100.64.0.0/10 addresses. "
                        "Link-local and cloud metadata addresses are always refused.",
                    ),
                ),
                (
                    "allow_space_api_key",
                    models.BooleanField(
                        default=False,
                        help_text="E2B/Cube on a public endpoint: a space's config may use its own API key instead "
                        "of this backend's (always through the SSRF guard, never with private endpoints).",
                        verbose_name="Spaces may bring their own API key",
                    ),
                ),
                (
                    "workspace_host_root",
                    models.CharField(
                        blank=True,
                        help_text="Cube: a directory on storage shared by every Cube node (e.g. "
                        "/srv/sandbox-workspaces); each session's /workspace is a directory under it, mounted from "
                        "the node. Empty: Cube sessions have no persistent /workspace. Changing it leaves existing "
                        "workspaces under the old root.",
                        max_length=500,
                        verbose_name="Workspace host root (Cube only)",
                    ),
                ),
                (
                    "pip_index_url",
                    models.CharField(
                        blank=True,
                        help_text="Package source for skill installs: a pip index URL the build sandbox can reach "
                        "(empty: none).",
                        max_length=500,
                    ),
                ),
                (
                    "pip_find_links",
                    models.CharField(
                        blank=True,
                        help_text="Package source for skill installs: the name of a wheel folder under the "
                        "deployment's SKILL_PACKAGE_SOURCES_ROOT, copied into the build sandbox (offline installs).",
                        max_length=200,
                    ),
                ),
                (
                    "npm_registry_url",
                    models.CharField(
                        blank=True,
                        help_text="Package source for skill installs: an npm registry URL (empty: none).",
                        max_length=500,
                    ),
                ),
                (
                    "max_cpus",
                    models.DecimalField(
                        decimal_places=2,
                        default=4,
                        help_text="The most CPU cores a config on this backend may give a sandbox.",
                        max_digits=5,
                        validators=[
                            django.core.validators.MinValueValidator(0.1),
                            django.core.validators.MaxValueValidator(64),
                        ],
                    ),
                ),
                (
                    "max_memory_mb",
                    models.PositiveIntegerField(
                        default=8192,
                        help_text="The most MiB a config on this backend may give a sandbox.",
                        validators=[
                            django.core.validators.MinValueValidator(64),
                            django.core.validators.MaxValueValidator(262144),
                        ],
                    ),
                ),
                (
                    "max_pids",
                    models.PositiveIntegerField(
                        default=4096,
                        help_text="The most processes a config on this backend may allow a sandbox (Docker).",
                        validators=[
                            django.core.validators.MinValueValidator(16),
                            django.core.validators.MaxValueValidator(100000),
                        ],
                    ),
                ),
                ("created", models.DateTimeField(auto_now_add=True)),
                ("updated", models.DateTimeField(auto_now=True)),
                (
                    "spaces",
                    models.ManyToManyField(
                        blank=True,
                        help_text="The spaces that may run configs on it.",
                        related_name="granted_backends",
                        to="console.space",
                    ),
                ),
            ],
            options={"ordering": ["name"]},
        ),
        migrations.AddField(
            model_name="sandboxconfig",
            name="backend",
            field=models.ForeignKey(
                null=True,
                on_delete=django.db.models.deletion.PROTECT,
                related_name="configs",
                to="sandboxes.platformbackend",
            ),
        ),
        migrations.RunPython(create_platform_backends, restore_config_infrastructure, atomic=True),
        *[migrations.RemoveField(model_name="sandboxconfig", name=field) for field in INFRA_FIELDS],
        migrations.AlterField(
            model_name="sandboxconfig",
            name="backend",
            field=models.ForeignKey(
                on_delete=django.db.models.deletion.PROTECT, related_name="configs", to="sandboxes.platformbackend"
            ),
        ),
    ]
