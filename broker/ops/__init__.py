"""What operators read: the fleet's agents and the capabilities' queues, read-only."""
