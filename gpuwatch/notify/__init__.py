"""Alerts to people: routing, grouping, inhibition, silences, a durable outbox, and one format
per service (docs/notify.md)."""
