"""Where a job runs: accelerator requests, the framework x accelerator matrix, flavors, the matcher.

Used by the training plane (``cascade.functions``) and the image renderer; it imports no
other plane.
"""
