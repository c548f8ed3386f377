"""Django's PostgreSQL backend with the console's check of pooled connections (`base`)."""
