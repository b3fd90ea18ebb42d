"""What the server tells its operators about itself: Prometheus metrics and request latency."""
