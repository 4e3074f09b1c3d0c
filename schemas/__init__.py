"""JSON Schemas (draft 2020-12) for every Cascade event type and job spec.

Shipped as package data so an installed Cascade validates exactly what the repository
documents. File names are the event type plus ``.json`` (``io.cascade.job.failed.v1.json``);
job specs are ``trainingjob.v1.json`` and ``finetunejob.v1.json``. Loaded by ``cascade.events.schemas``.
"""
