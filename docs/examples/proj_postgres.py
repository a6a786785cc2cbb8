# proj_postgres.py: the same project, its runs decided in PostgreSQL (the tasks still go over RabbitMQ).
from proj import app

app.conf.anarchon_backend = "postgresql://beat@db.internal/proj"
