"""Sphinx configuration of anarchon_celery's documentation.

Build it with ``python3 -m sphinx -W --keep-going -b html docs docs/_build/html`` (the ``docs``
extra installs what it needs); the test suite builds it the same way, warnings as errors.
"""

from __future__ import annotations

import anarchon_celery

project = "anarchon_celery"
author = "anarchon_celery contributors"
copyright = "2026, anarchon_celery contributors"
release = anarchon_celery.__version__
version = release

extensions = [
    "myst_parser",  # pages in Markdown (CommonMark), as the README
    "sphinx.ext.autodoc",  # the Python API from its docstrings
    "sphinx.ext.napoleon",
    "sphinx.ext.viewcode",
    "sphinx_click",  # every `celery anarchon` command from its click definition
]

source_suffix = {".md": "markdown", ".rst": "restructuredtext"}
exclude_patterns = ["_build", "examples/README.md"]
root_doc = "index"

myst_enable_extensions = ["colon_fence", "deflist"]
# Headings get anchors from their text (`#rolling-deploys`), as on GitHub; the anchors that log
# messages point at are also explicit labels, checked by tests/test_docs.py.
myst_heading_anchors = 3

autodoc_member_order = "bysource"
autodoc_typehints = "description"
autodoc_default_options = {"members": True, "show-inheritance": True}

html_theme = "furo"
html_title = f"anarchon_celery {release}"
html_static_path: list[str] = []
html_show_sourcelink = False

# The site builds offline: no intersphinx inventory is fetched.
nitpicky = False
