# proj_sqlite.py: the same project, its runs decided in a SQLite file (every beat on one host).
import os

from proj import app

app.conf.anarchon_backend = "sqlite:///" + os.environ.get("PROJ_DB", "/var/lib/proj/anarchon.db")
