"""Durability benchmark: what the Redis journal costs a Step, and restarts after kill -9."""
