"""Event sources that pull rather than receive: a watched folder and S3 notifications on Kafka."""
