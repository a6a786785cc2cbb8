"""The Celery apps the tests run in real beat and worker processes (``celery -A tests.apps.NAME``)."""
