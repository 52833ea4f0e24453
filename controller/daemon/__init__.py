"""The daemon: APScheduler wiring, leader lock, wake-ups, health endpoints, shutdown."""
