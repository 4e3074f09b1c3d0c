"""Wire bindings of CloudEvents: Kafka records and HTTP requests, as pure functions."""
