"""Sphinx configuration of the Trusted Cloud release notes (reno).

Build with ``tox -e releasenotes``, or::

    .venv/bin/sphinx-build -a -E -W -b html releasenotes/source \
        releasenotes/build/html

reno reads the notes from git history: a note shows up once it is committed.
"""

project = "Trusted Cloud Release Notes"
copyright = "Trusted Cloud developers; Apache-2.0"
author = "Trusted Cloud developers"

extensions = ["reno.sphinxext"]

templates_path: list[str] = []
exclude_patterns: list[str] = []
source_suffix = {".rst": "restructuredtext"}
root_doc = "index"
language = "en"
pygments_style = "sphinx"

html_theme = "alabaster"
html_static_path: list[str] = []
html_title = "Trusted Cloud Release Notes"
