"""Hyper-parameter search: experiments whose trials are training jobs (``controller``), their search spaces
(``space``) and the Katib rendering for clusters that run Katib (``katib``)."""
