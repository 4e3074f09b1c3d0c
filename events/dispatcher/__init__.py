"""The dispatcher: one consumer group per trigger, delivering matching events to subscribers.

At-least-once delivery over the CloudEvents HTTP binding, with Knative's retry and
dead-letter semantics, contiguous-prefix commits, and idempotency claims that keep a
redelivered, already-handled event from reaching its subscriber twice.
"""

from cascade.events.dispatcher.service import Dispatcher

__all__ = ["Dispatcher"]
