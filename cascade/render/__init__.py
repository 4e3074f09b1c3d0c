"""Renderers of the cluster form: ``knative/`` manifests (``manifests``) and ``images/``
Dockerfiles (``images``), with the drift check ``cascade render --check`` uses."""
