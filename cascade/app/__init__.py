"""The composition root: builds buses, stores and planes from settings, starts and stops them
in order (``platform``), and serves the dashboard. Commands in ``cascade.cli`` call into here."""
