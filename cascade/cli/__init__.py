"""The ``cascade`` command line and the wiring that builds buses and stores from settings."""
