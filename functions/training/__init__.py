"""Training: one job spec, the right launch for each framework, on matching accelerators.

``job`` is the spec; ``env`` gives the environment each operator injects; ``kinds`` renders
the Kubernetes resources; ``local`` and ``kubernetes`` are the two backends.
"""
