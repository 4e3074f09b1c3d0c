"""A local twin of Knative Serving: an activator, a KPA autoscaler and process instances.

Functions and model servers are services that scale to zero. Every request goes through
the activator, which buffers it while an instance starts and routes it to the least busy
ready instance within ``containerConcurrency``; the autoscaler sizes each service from the
concurrency the activator observes, with Knative's annotation names and defaults.
"""
