"""Data files of the dashboard (a package so that the wheel ships them)."""
