"""What makes the allocator survive a crash: every change as a journaled command, snapshots of
the whole core, the Redis store they go to, and the one gate through which the server reaches
the core. Imports the core; never the server."""
