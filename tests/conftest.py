"""Test layout: tests/<package>/ mirrors ray_geolb/<package>/ (policy, engine, sim, serve); each file is
named after the behaviour it checks. Helpers shared across folders live next to this file
(``import_graph.py``, ``policy_cases.py``) and are imported by name (pytest puts this folder on
``sys.path`` because this conftest lives here)."""
